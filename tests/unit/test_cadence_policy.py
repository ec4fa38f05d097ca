"""``auto``'s choice between vLLM's cadence, ``balance`` and ``merge`` under serving noise.

The chooser is driven step by step on a simulated clock. Each cadence has a
per-token cost; steps carrying a burst of prefill (arrivals, resumed
preemptions) take longer whatever the cadence, as they do behind ``vllm serve``.
Where the cadences cost the same, bursts must not make ``auto`` switch back
and forth; where one is clearly faster, ``auto`` must still find it; where none
beats vLLM's own by the margin, ``auto`` runs vLLM's.
"""

from __future__ import annotations

import random

import pytest

from vllm_pp_cudagraph.engine_core.cadence_policy import CadenceChooser
from vllm_pp_cudagraph.shared.settings import DecodeCadence


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


VLLM, BALANCE, MERGE = DecodeCadence.VLLM, DecodeCadence.BALANCE, DecodeCadence.MERGE


def drive(per_token_ms, steps: int, pp: int = 2,
          decoders=lambda step: 32, burst=lambda step: 1.0,
          trace: list[DecodeCadence] | None = None) -> CadenceChooser:
    """Run ``steps`` scheduler steps: under ``merge`` every decoding request takes a
    token per step, under ``balance`` and vLLM's cadence one group of ``pp`` does, so a
    step costs ``per_token_ms`` (merge) or ``per_token_ms / pp`` (the others), times
    ``burst(step)``. ``per_token_ms``: a dict by cadence, or a function of the step
    returning one. ``trace`` gets each step's cadence."""
    clock = _Clock()
    chooser = CadenceChooser(pp, clock=clock)
    for step in range(steps):
        cadence, n = chooser.cadence, decoders(step)
        if trace is not None:
            trace.append(cadence)
        costs = per_token_ms(step) if callable(per_token_ms) else per_token_ms
        # Otherwise ``pp`` groups take turns; the remainder's requests in the first ones.
        tokens = n if cadence is MERGE else n // pp + (step % pp < n % pp)
        step_ms = costs[cadence] * (1 if cadence is MERGE else 1 / pp)
        clock.now += step_ms * burst(step) / 1e3
        chooser.record_step(tokens, n)
    return chooser


def bursts(seed: int, share: float = 0.08, slowdown: float = 4.0):
    """Steps that carry a prefill burst: ``share`` of them, ``slowdown`` times as long."""
    rng = random.Random(seed)
    table = [slowdown if rng.random() < share else 1.0 for _ in range(100_000)]
    return lambda step: table[step]


TIE = {VLLM: 40.0, MERGE: 40.0, BALANCE: 40.0}


def load_moves(step: int) -> int:
    """Decoding requests that move from 16 to 40 at step 200 of every 400, and back."""
    return 16 if step % 400 < 200 else 40


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pp", [2, 4])
def test_prefill_bursts_do_not_make_auto_switch_back_and_forth_between_equals(seed, pp):
    chooser = drive(TIE, 20_000, pp=pp, burst=bursts(seed))
    # A switch is harmless here (both cost the same) but each one re-forms the groups;
    # one now and then is noise, a switch every few trials is the bursts deciding.
    assert len(chooser.switches) <= 3, [(s, c.value) for s, c, *_ in chooser.switches]


@pytest.mark.parametrize("pp", [2, 4])
def test_a_burst_as_the_load_moves_does_not_decide_the_cadence(pp):
    """Arrivals lift the decoding requests from 16 to 40 with a burst of prefill: the
    window that saw it is no measure of the incumbent at the new load."""
    def burst(step: int) -> float:
        return 4.0 if step % 400 in range(200, 200 + 2 * pp) else 1.0

    chooser = drive(TIE, 8_000, pp=pp, decoders=load_moves, burst=burst)
    assert chooser.switches == []


@pytest.mark.parametrize("pp", [2, 4])
def test_a_burst_in_the_windows_after_the_load_moves_does_not_decide_the_cadence(pp):
    """The arrivals that lift the load keep prefilling for a while after it: a burst
    3x as slow, from half a window to a window and a round long, starting anywhere in
    the two windows after the move. Measured against the incumbent's window after the
    trial as well, the trial never wins."""
    window = 3 * pp
    for offset in range(0, 2 * window, pp):
        for length in (window // 2, window, window + pp):
            def burst(step: int, start=200 + offset, end=200 + offset + length) -> float:
                return 3.0 if start <= step % 400 < end else 1.0

            chooser = drive(TIE, 4_000, pp=pp, decoders=load_moves, burst=burst)
            assert chooser.switches == [], (offset, length, len(chooser.switches))


@pytest.mark.parametrize("wins", [MERGE, BALANCE])
@pytest.mark.parametrize("seed", range(3))
def test_under_bursts_auto_still_settles_on_the_clearly_faster_cadence(wins, seed):
    costs = {VLLM: 45.0, MERGE: 45.0, BALANCE: 45.0, wins: 30.0}
    chooser = drive(costs, 6_000, burst=bursts(seed))
    assert chooser.cadence is wins
    assert [c for _, c, *_ in chooser.switches] == [wins]
    assert all(step < 300 for step, *_ in chooser.switches), chooser.switches


@pytest.mark.parametrize("balance_ms", [38.5, 40.0, 42.0])
@pytest.mark.parametrize("seed", range(3))
def test_auto_keeps_vllms_cadence_unless_another_beats_it_by_the_margin(balance_ms, seed):
    """vLLM's own cadence is a candidate and wins ties: where ``balance`` is no more than
    the margin (5%) faster, or slower, and ``merge`` far slower, auto never leaves it for
    longer than its trials."""
    trace: list[DecodeCadence] = []
    chooser = drive({VLLM: 40.0, BALANCE: balance_ms, MERGE: 70.0}, 6_000,
                    burst=bursts(seed, share=0.02), trace=trace)
    assert chooser.incumbent is VLLM
    assert chooser.switches == []
    assert trace.count(VLLM) > 0.95 * len(trace)


def test_auto_goes_back_to_vllms_cadence_once_the_one_it_chose_stops_beating_it():
    """``balance`` pays at first (30 against 45 ms per token), then costs more than vLLM's
    cadence (45 against 40): auto must not keep running a cadence measured slower than
    vLLM's, however long it has held."""
    def costs(step: int) -> dict:
        early = step < 3_000
        return {VLLM: 45.0 if early else 40.0, BALANCE: 30.0 if early else 45.0, MERGE: 90.0}

    trace: list[DecodeCadence] = []
    chooser = drive(costs, 12_000, trace=trace)
    assert [c for _, c, *_ in chooser.switches] == [BALANCE, VLLM]
    assert trace[2_900] is BALANCE
    assert chooser.incumbent is VLLM
    # Found within two of the longest gaps between trials (128 windows of the incumbent).
    assert chooser.switches[1][0] < 3_000 + 2 * 128 * chooser.window_steps


@pytest.mark.parametrize("pp", [2, 4])
def test_a_trial_far_behind_ends_after_one_round(pp):
    """A trial of a cadence three times slower costs one round of its groups (and the
    steps that re-form them), not a whole window, with steps a little uneven as on a GPU."""
    rng = random.Random(0)
    jitter = [rng.uniform(0.98, 1.02) for _ in range(3_000)]
    trace: list[DecodeCadence] = []
    chooser = drive({MERGE: 30.0, BALANCE: 90.0, VLLM: 90.0}, 3_000, pp=pp,
                    burst=jitter.__getitem__, trace=trace)
    assert [c for _, c, *_ in chooser.switches] == [MERGE]
    adopted = chooser.switches[0][0]
    trials = [len(run) for run in "".join("m" if c is MERGE else "o"
                                          for c in trace[adopted:]).split("m") if run]
    assert trials and max(trials) <= 2 * pp + 1, trials


def test_a_cadence_that_lost_widely_is_backed_off_at_that_load():
    """At a steady load where ``merge`` takes 1.6x vLLM's cadence per token (the 32B shape
    at 1,024 requests), its trials get rarer up to a long back-off instead of coming back
    every 128 windows; the steps they cost are counted."""
    chooser = drive({VLLM: 67.0, BALANCE: 67.0, MERGE: 110.0}, 40_000)
    assert chooser.incumbent is VLLM and chooser.switches == []
    assert chooser.wide_losses["merge"] == chooser.trials["merge"] >= 3
    # ``balance`` ties, so it comes back every 128 windows at most; ``merge`` 1, 32, 128,
    # 512, then 1,024 windows apart: 9 trials in these 6,667 windows.
    assert chooser.trials["merge"] <= 9 < chooser.trials["balance"] / 4
    # Each trial ends after one round (pp steps) and the steps that re-form the groups.
    assert chooser.trial_steps["merge"] <= chooser.trials["merge"] * (1 + 2 * 2)


def test_each_trial_leaves_its_verdict_with_what_it_measured():
    """Why ``auto`` kept or left a cadence is kept per trial: the one adopted at the
    switch's step with the switch's figures, each wide loss with its 1.25x or more."""
    chooser = drive({VLLM: 67.0, BALANCE: 60.0, MERGE: 110.0}, 6_000)
    step, adopted, interval, beaten, decoders = chooser.switches[0]
    assert adopted is BALANCE
    won = [v for v in chooser.verdicts if v.outcome == "adopted"]
    assert [(v.step, v.cadence, v.interval, v.against, v.decoders) for v in won][:1] == [
        (step, BALANCE, interval, beaten, decoders)]
    lost = [v for v in chooser.verdicts if v.cadence is MERGE]
    assert lost and all(v.outcome == "lost widely" and v.interval >= 1.25 * v.against
                        for v in lost)
    # Every trial started has one verdict, but the one still running.
    assert sum(chooser.trials.values()) - len(chooser.verdicts) in (0, 1)


def test_the_back_off_holds_when_the_load_comes_back_and_lifts_at_another_load():
    """The load drains and refills between passes of a benchmark: back at the load where
    ``merge`` lost widely it stays backed off; at a load it never lost at, it is tried
    again as soon as the incumbent has been measured there."""
    def decoders(step: int) -> int:
        return 1024 if step < 12_000 or step >= 13_000 else 256

    trace: list[DecodeCadence] = []
    chooser = drive({VLLM: 67.0, BALANCE: 67.0, MERGE: 110.0}, 20_000, decoders=decoders,
                    trace=trace)
    merge_at = [i for i, c in enumerate(trace) if c is MERGE]
    assert any(12_000 <= i < 12_000 + 8 * chooser.window_steps for i in merge_at), \
        "not tried again at a new load"
    assert not any(13_000 <= i < 13_000 + 200 * chooser.window_steps for i in merge_at), \
        "tried again soon at the load where it lost widely"


def test_after_a_drain_the_load_coming_back_starts_on_vllms_cadence():
    """Between passes of a benchmark the engine drains to a request or two, where auto
    runs merge (no groups to form); when a thousand requests come back, merge is the worst
    cadence there (the 32B shape: 110 against 67 ms per token), so auto must not measure
    the new load on it: it goes back to vLLM's cadence at once."""
    def decoders(step: int) -> int:
        return 1 if 6_000 <= step % 12_000 < 6_300 else 1024

    trace: list[DecodeCadence] = []
    drive({VLLM: 67.0, BALANCE: 67.0, MERGE: 110.0}, 24_000, decoders=decoders, trace=trace)
    assert MERGE in trace[6_000:6_300]
    back = trace[6_300:6_300 + 200]
    assert back.count(MERGE) <= 3 * 2 + 2 + 6, back.count(MERGE)


def test_after_a_drain_the_load_coming_back_resumes_the_cadence_that_won_there():
    """The 32B shape at 1,024 requests on 2x H100: ``balance`` 66 ms per token, vLLM's
    cadence 89, ``merge`` 110. Once ``balance`` has won at that load, a drain between
    passes must not send the next pass back to vLLM's cadence to win it again (a GPU run
    spent most of a pass there): the returning load resumes ``balance`` at once."""
    def decoders(step: int) -> int:
        return 1 if 6_000 <= step % 12_000 < 6_300 else 1024

    trace: list[DecodeCadence] = []
    chooser = drive({VLLM: 89.0, BALANCE: 66.0, MERGE: 110.0}, 24_000, decoders=decoders,
                    trace=trace)
    assert [s[1] for s in chooser.switches] == [BALANCE], chooser.switches
    assert trace[5_999] is BALANCE and MERGE in trace[6_000:6_300]
    back = trace[6_300:6_300 + 400]
    # The window that sees the load move runs on merge; then balance, but for trials.
    assert back.count(VLLM) <= 2 * chooser.window_steps, back.count(VLLM)
    assert back[-1] is BALANCE


def closed_loop_waves(step: int) -> int:
    """A closed-loop benchmark whose requests all ask for the same length: a wave of
    1,024 decoding requests drains to one over 512 steps, then the next wave starts."""
    return max(1, 1024 - 2 * (step % 512))


@pytest.mark.parametrize("costs", [
    {VLLM: 50.0, BALANCE: 40.0, MERGE: 52.0},
    {VLLM: 40.0, BALANCE: 40.0, MERGE: 70.0},
    {VLLM: 60.0, BALANCE: 40.0, MERGE: 45.0},
], ids=["balance-wins", "vllm-holds", "merge-second"])
@pytest.mark.parametrize("seed", range(3))
def test_under_waves_of_load_trials_stay_as_rare_as_at_a_steady_load(costs, seed):
    """Each wave sweeps the load through every level again. A candidate that lost at a
    level keeps its back-off there for the windows measured there, so after the first
    waves the trials cost a few steps in a hundred, not one trial per level per wave
    (on the GPU's 0.6B cell: 69-79 trials in five waves)."""
    waves, learning = 24, 8
    trace: list[DecodeCadence] = []
    chooser = drive(costs, 512 * waves, decoders=closed_loop_waves,
                    burst=bursts(seed, share=0.02), trace=trace)
    best = min(costs, key=costs.get)  # vLLM's cadence where it ties
    assert chooser.incumbent is best
    late = trace[512 * learning:]
    off_best = sum(1 for cadence in late if cadence is not best)
    assert off_best <= 0.035 * len(late), off_best


def test_under_waves_of_load_auto_goes_back_to_vllms_cadence_once_it_is_faster():
    """The back-offs that keep trials rare under waves must still let auto leave a
    cadence that stopped paying: ``balance`` wins at first, then costs more than vLLM's
    cadence from wave 12. Within 24 more waves every wave runs on vLLM's cadence."""
    def costs(step: int) -> dict:
        if step < 512 * 12:
            return {VLLM: 50.0, BALANCE: 40.0, MERGE: 70.0}
        return {VLLM: 40.0, BALANCE: 50.0, MERGE: 70.0}

    for seed in range(3):
        trace: list[DecodeCadence] = []
        drive(costs, 512 * 48, decoders=closed_loop_waves, burst=bursts(seed, share=0.02),
              trace=trace)
        shares = [trace[512 * w:512 * (w + 1)].count(VLLM) / 512 for w in range(36, 48)]
        assert min(shares) >= 0.9, (seed, shares)
