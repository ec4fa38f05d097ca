"""Moving decodes between PP steps: the schedule each cadence makes, and every first-stage
input still right.

vLLM's real ``AsyncScheduler`` at ``pipeline_parallel_size=2`` is driven the way the engine
core drives it (``pp_size + 1`` batches in flight). Each step is also played through a
first stage (``_first_stage.py``: vLLM's real ``PPHandler`` ring, consumed as vLLM's
runner does, plus the plugin's early consume). How fast each cadence serves, timed on a
simulated pipeline, is tested in ``test_pipeline_sim.py``.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _first_stage import MAX_REQS, FirstStage, Run, serve
from _scheduler import make_requests, make_scheduler, use_cadence
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request
from vllm.v1.worker.gpu import pp_utils

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.engine_core.decode_cadence import (
    lift_idle_cadence,
    merge_decode_groups,
)
from vllm_pp_cudagraph.shared.settings import DecodeCadence, PPCudaGraphSettings
from vllm_pp_cudagraph.worker.pipeline.first_stage_tokens import (
    consume_entries_needed_by,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_model_dir(tmp_path_factory.mktemp("model"), tokenizer=False))


def _cadence(cadence: str):
    """Schedulers built from now on are the plugin's, with ``cadence``; return the undo."""
    return use_cadence(PPCudaGraphSettings(decode_cadence=cadence))


@pytest.fixture
def fill():
    undo = _cadence("fill")
    yield
    undo()


@pytest.fixture
def merged():
    undo = _cadence("merge")
    yield
    undo()


@pytest.fixture(autouse=True)
def host_copies(monkeypatch):
    # vLLM's ring copies a masked index list to the GPU through pinned memory,
    # which needs a GPU; here the "device" is the CPU.
    # (async_copy_to_gpu up to 0.29, async_tensor_h2d from 0.30)
    for name in ("async_copy_to_gpu", "async_tensor_h2d"):
        if hasattr(pp_utils, name):
            monkeypatch.setattr(pp_utils, name, lambda array, device=None: torch.from_numpy(array))


def lone_group(model_dir: str, pp: int = 2) -> Run:
    requests = make_requests(8, random.Random(0), prompt=(4, 4), output=(40, 40))
    return serve(make_scheduler(model_dir, num_blocks=64, pp=pp), requests, [0] * 8)


def empty_steps(run: Run) -> int:
    return sum(1 for s in run.steps if not s)


def test_lone_group_decodes_on_every_step(model_dir, fill):
    run = lone_group(model_dir)
    assert run.problems == []
    # The tail waits for the last tokens in flight rather than decode past max_tokens.
    assert empty_steps(run) <= 3, run.steps
    assert len(run.steps) <= 45  # one prefill step and 40 tokens, a few steps of tail


def scheduled_steps(run: Run) -> dict[str, list[int]]:
    """Per request, the steps that scheduled it."""
    steps: dict[str, list[int]] = {}
    for index, step in enumerate(run.steps):
        for req_id in step:
            steps.setdefault(req_id, []).append(index)
    return steps


@pytest.mark.parametrize("pp", [2, 4])
def test_no_request_is_scheduled_past_max_tokens(model_dir, fill, pp):
    """Each request is scheduled once for its prompt and once per further token:
    with outputs in flight that already complete it, the fill must not lift it
    (vLLM's own skip assumes at most one output in flight)."""
    run = lone_group(model_dir, pp=pp)
    assert run.problems == []
    extra = {rid: len(steps) - 40 for rid, steps in scheduled_steps(run).items()}
    assert set(extra.values()) == {0}, extra


@pytest.mark.parametrize("cadence", ["fill", "merge", "auto"])
@pytest.mark.parametrize("pp", [2, 4])
def test_structured_output_requests_keep_vllms_cadence(model_dir, cadence, pp):
    """The engine core builds a step's grammar bitmask after applying only the
    oldest batch in flight; vLLM's cadence (a decode every pp_size steps) is what
    makes that batch hold a structured request's previous token. Half the
    requests are structured, arriving over time, 20 seeds: no structured request
    may decode sooner than pp_size steps after its last decode, while the
    unstructured ones are still lifted, and none is scheduled past max_tokens."""
    undo = _cadence(cadence)
    too_soon, lifted = [], 0
    try:
        for seed in range(20):
            rng = random.Random(seed)
            requests = make_requests(12, rng, structured=lambda i: i % 2 == 0)
            arrivals = [rng.randint(0, 20) for _ in range(12)]
            run = serve(make_scheduler(model_dir, num_blocks=64, pp=pp), requests, arrivals)
            assert run.problems == []
            most = {r.request_id: r.max_tokens + r.num_preemptions for r in requests}
            for rid, steps in scheduled_steps(run).items():
                assert len(steps) <= most[rid], (seed, rid)
                gaps = [b - a for a, b in zip(steps, steps[1:])]
                if int(rid) % 2 == 0:
                    too_soon += [(seed, rid, g) for g in gaps if g < pp]
                else:
                    lifted += sum(g < pp for g in gaps)
    finally:
        undo()
    assert too_soon == []
    assert lifted > 0, "nothing was lifted: nothing was tested"


def test_vllm_cadence_leaves_every_other_step_empty(model_dir):
    run = lone_group(model_dir)
    assert run.problems == []
    assert empty_steps(run) >= 35
    assert len(run.steps) >= 75


def test_pp4_lone_group_decodes_on_every_step(model_dir, fill):
    run = lone_group(model_dir, pp=4)
    assert run.problems == []
    assert empty_steps(run) <= 5  # as at PP=2, the tail waits for its last tokens


def test_interleaved_groups_are_scheduled_as_vllm_does(model_dir):
    """Two groups that fill alternate steps: no step is idle, so nothing is lifted."""

    def two_groups() -> Run:
        requests = make_requests(8, random.Random(1), output=(30, 30))
        return serve(make_scheduler(model_dir, num_blocks=64), requests, [0, 0, 0, 0, 1, 1, 1, 1])

    stock = two_groups()
    undo = _cadence("fill")
    try:
        patched = two_groups()
    finally:
        undo()
    assert patched.problems == stock.problems == []
    assert len(set(stock.steps[2:20])) == 2, "stock should alternate two groups"
    assert patched.steps[:20] == stock.steps[:20]


def test_merged_groups_decode_together_on_every_step(model_dir, merged):
    """Requests arriving one step apart form two groups that take turns under vLLM's
    cadence; merged, every step from the third on decodes all of them, and every
    first-stage input is still the token the last stage sampled."""
    run = two_groups(model_dir, pp=2)
    assert run.problems == []
    everyone = frozenset(run.steps[2])
    assert len(everyone) == 8
    assert all(step == everyone for step in run.steps[2:28]), run.steps[:30]
    assert run.consumed_early > 0
    assert len(run.steps) <= 35  # two prefill steps, 30 tokens, a short tail


def test_merge_lifts_every_held_request_it_may():
    a, b, c = _request("a", 7), _request("b", 5), _request("c", 6)
    assert merge_decode_groups([a, b, c], step=5) == 2
    assert [r.next_decode_eligible_step for r in (a, b, c)] == [5, 5, 5]
    assert merge_decode_groups([a, b, c], step=5) == 0


def arrivals_under_preemption(model_dir: str, pp: int) -> list[Run]:
    """40 seeded serving runs of 12 requests arriving over 40 steps, with the KV cache short."""
    runs = []
    for seed in range(40):
        rng = random.Random(seed)
        arrivals = [rng.randint(0, 40) for _ in range(12)]
        runs.append(serve(make_scheduler(model_dir, pp=pp), make_requests(12, rng), arrivals))
    return runs


def problems_and_preemptions(runs: list[Run]) -> tuple[list[str], int]:
    problems = [f"seed {seed}: {p}" for seed, run in enumerate(runs) for p in run.problems]
    return problems, sum(r.num_preemptions for run in runs for r in run.requests)


@pytest.mark.parametrize("pp", [2, 4])
def test_arrivals_and_preemption_keep_tokens_and_first_stage_inputs_right(model_dir, fill, pp):
    problems, preemptions = problems_and_preemptions(arrivals_under_preemption(model_dir, pp))
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []


@pytest.mark.parametrize("pp", [2, 4])
def test_merged_arrivals_and_preemption_keep_tokens_and_first_stage_inputs_right(
    model_dir, merged, pp
):
    problems, preemptions = problems_and_preemptions(arrivals_under_preemption(model_dir, pp))
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []


@pytest.mark.parametrize("pp", [2, 4])
def test_with_vllms_cadence_the_early_consume_never_acts(model_dir, pp):
    """vLLM's cadence kept: the first stage takes each token when vLLM's runner would.

    The runner's early consume stays installed with DECODE_CADENCE=vllm; with vLLM's
    cadence a request is never scheduled while an output of its own is still in
    the ring, so the consume must find nothing to take, whatever arrives or is
    preempted: the first stage then runs exactly as stock's does.
    """
    runs = arrivals_under_preemption(model_dir, pp)
    problems, preemptions = problems_and_preemptions(runs)
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []
    assert sum(run.consumed_early for run in runs) == 0


def test_the_fill_relies_on_the_early_consume(model_dir, fill):
    run = lone_group(model_dir)
    assert run.problems == [] and run.consumed_early > 0


def test_first_stage_reads_stale_tokens_without_the_early_consume(model_dir, fill):
    """The scheduler half alone is wrong: this is what the runner half prevents."""
    requests = make_requests(8, random.Random(0), prompt=(4, 4), output=(40, 40))
    run = serve(make_scheduler(model_dir, num_blocks=64), requests, [0] * 8, early_consume=False)
    assert any("first stage read" in p for p in run.problems)


def test_a_freed_slot_reused_this_step_does_not_consume_its_old_owners_tokens():
    """A ring entry for a finished request is left to vLLM's own consume.

    Request "old" finished with a sampled token still in the ring; its slot was
    freed and given to "new" in the same step. The step decodes "new" (the same
    request index), but the entry holds "old"'s token: taking it early would
    consume hand-offs in the wrong order for every request in that entry.
    """
    stage = FirstStage(pp_size=2, early_consume=True)
    stage.index["old"] = slot = stage.free.pop()
    step = SimpleNamespace(num_scheduled_tokens={"old": 1})
    stage.receive(step, {"old": 42})
    assert stage.handler.get_prev_sampled_outputs() is None  # the next step begins
    stage._free("old")
    stage.index["new"] = stage.free.pop()
    assert stage.index["new"] == slot
    entry = stage.handler.queue[-2]
    assert consume_entries_needed_by(stage.handler, np.array([slot], dtype=np.int32)) == []
    assert stage.handler.queue[-2] is entry


def _request(name: str, eligible_at: int) -> Request:
    request = Request(request_id=name, prompt_token_ids=[1, 2], pooling_params=None,
                      sampling_params=SamplingParams(max_tokens=4))
    request.next_decode_eligible_step = eligible_at
    return request


def test_lift_takes_only_the_group_eligible_first():
    a, b, c = _request("a", 7), _request("b", 6), _request("c", 6)
    assert lift_idle_cadence([a, b, c], step=5) == 2
    assert [r.next_decode_eligible_step for r in (a, b, c)] == [7, 5, 5]


def test_lift_leaves_a_step_with_eligible_work_alone():
    a, b = _request("a", 7), _request("b", 5)
    assert lift_idle_cadence([a, b], step=5) == 0
    assert lift_idle_cadence([], step=5) == 0
    assert a.next_decode_eligible_step == 7


def test_the_scheduler_runs_its_engines_planned_cadence(model_dir):
    """The scheduler plans its engine once: vLLM's cadence at PP=1."""
    undo = _cadence("merge")
    try:
        for pp, expected in ((2, DecodeCadence.MERGE), (1, DecodeCadence.VLLM)):
            scheduler = make_scheduler(model_dir, pp=pp)
            scheduler.schedule()
            assert scheduler.cadence is expected
    finally:
        undo()


def two_groups(model_dir: str, pp: int) -> Run:
    """Eight requests arriving over two steps: under vLLM's cadence, two groups."""
    requests = make_requests(8, random.Random(1), output=(30, 30))
    arrivals = [0, 0, 0, 0, 1, 1, 1, 1]
    return serve(make_scheduler(model_dir, num_blocks=64, pp=pp), requests, arrivals)


def _balanced(pp: int, run: Run, first: int) -> None:
    sizes = [len(step) for step in run.steps[first:first + 20]]
    assert set(sizes) == {8 // pp}, run.steps[:first + 20]
    assert all(a.isdisjoint(b) for a, b in zip(run.steps[first:], run.steps[first + 1:first + pp]))


@pytest.mark.parametrize("pp", [2, 4])
def test_balance_splits_a_lone_group_into_even_groups(model_dir, pp):
    """Eight requests arriving at once decode, under vLLM's cadence, all in one step
    of every pp_size; balanced, every step decodes a pp_size-th of them, so each
    stage has work while the others run. Only delays: no early consume, tokens right."""
    undo = _cadence("balance")
    try:
        run = lone_group(model_dir, pp=pp)
    finally:
        undo()
    assert run.problems == [] and run.consumed_early == 0
    _balanced(pp, run, first=pp + 1)
    assert empty_steps(run) <= 2 * pp + 1, run.steps  # until the first decodes, and the tail


def test_balance_evens_out_lopsided_groups(model_dir):
    """Six requests, then two a step later: vLLM keeps groups of six and two for
    good; balanced, they become two groups of four."""
    requests = make_requests(8, random.Random(1), output=(30, 30))
    undo = _cadence("balance")
    try:
        run = serve(make_scheduler(model_dir, num_blocks=64), requests, [0] * 6 + [1, 1])
    finally:
        undo()
    assert run.problems == [] and run.consumed_early == 0
    _balanced(2, run, first=4)


@pytest.mark.parametrize("pp", [2, 4])
def test_balanced_arrivals_and_preemption_never_decode_sooner_and_keep_tokens_right(
    model_dir, pp
):
    """Balancing only delays: no request is ever scheduled while an output of its own
    is still in the ring (the early consume finds nothing to take), whatever arrives
    or is preempted, and every token and first-stage input is right."""
    undo = _cadence("balance")
    try:
        runs = arrivals_under_preemption(model_dir, pp)
    finally:
        undo()
    problems, preemptions = problems_and_preemptions(runs)
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []
    assert sum(run.consumed_early for run in runs) == 0


def test_the_plugins_scheduler_is_named_only_for_a_pp_engine_on_vllms_async_scheduler(
        model_dir):
    """After vLLM settles a config, the plugin's scheduler is named where vLLM would run its
    own async one under PP; a class the user chose, sync scheduling and PP=1 keep theirs."""
    from _scheduler import pp_engine_config
    from vllm.config import VllmConfig

    from vllm_pp_cudagraph.api_server.scheduler_choice import wrap_config_post_init
    from vllm_pp_cudagraph.shared.engine_plan import PLUGIN_SCHEDULER

    settled = wrap_config_post_init(lambda config: None)  # vLLM's own part already ran
    chosen = {}
    for name, config in (("pp2", pp_engine_config(model_dir)),
                         ("pp1", pp_engine_config(model_dir, pp=1)),
                         ("sync", pp_engine_config(model_dir, async_scheduling=False)),
                         ("own", pp_engine_config(model_dir))):
        if name == "own":
            config.scheduler_config.scheduler_cls = "my.Scheduler"
        if name == "sync":
            config.scheduler_config.scheduler_cls = None
        settled(config)
        chosen[name] = config.scheduler_config.scheduler_cls
    assert chosen == {"pp2": PLUGIN_SCHEDULER, "pp1": None, "sync": None, "own": "my.Scheduler"}
    config = pp_engine_config(model_dir)
    settled(config)
    assert config.scheduler_config.get_scheduler_cls().__mro__[1] is AsyncScheduler
    own = VllmConfig.__dict__["__post_init__"]
    assert patches.apply_patch("scheduler-class",
                               PPCudaGraphSettings(decode_cadence="vllm")) is None
    undo = patches.apply_patch("scheduler-class", PPCudaGraphSettings())
    assert VllmConfig.__dict__["__post_init__"] is not own
    undo()
    assert VllmConfig.__dict__["__post_init__"] is own


def requests_that_stop_early(count: int) -> tuple[list[Request], dict[str, int]]:
    """Greedy requests of which every third ends at a stop token (as at EOS), at a
    position the stand-in last stage samples; the expected output length of each."""
    from vllm.sampling_params import SamplingParams

    rng = random.Random(7)
    requests, expected = [], {}
    for i in range(count):
        prompt, max_tokens = rng.randint(2, 30), rng.randint(10, 40)
        stop_at = rng.randint(1, max_tokens - 2) if i % 3 == 0 else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                                stop_token_ids=[prompt + stop_at] if stop_at else None)
        requests.append(Request(request_id=str(i), prompt_token_ids=[5] * prompt,
                                sampling_params=params, pooling_params=None))
        expected[str(i)] = stop_at + 1 if stop_at else max_tokens
    return requests, expected


@pytest.mark.parametrize("cadence", ["auto", "merge", "balance", "fill"])
@pytest.mark.parametrize("pp", [2, 4])
def test_requests_that_stop_early_or_are_aborted_leave_every_output_right(model_dir, cadence,
                                                                          pp):
    """Stop tokens (EOS) end requests inside the scheduler; stop strings end them from
    outside (the engine core aborts them between steps). Under every cadence the
    others' tokens, and the first stage's inputs, stay exact, and nothing crashes."""
    from vllm.v1.request import RequestStatus

    undo = _cadence(cadence)
    try:
        scheduler = make_scheduler(model_dir, num_blocks=64, pp=pp, max_num_seqs=MAX_REQS)
        requests, expected = requests_that_stop_early(24)
        aborted = {"1", "4", "10"}
        steps = [0]

        original_schedule = scheduler.schedule

        def schedule_and_abort():
            steps[0] += 1
            if steps[0] == 12:  # a stop string matched in the output processor
                scheduler.finish_requests(sorted(aborted), RequestStatus.FINISHED_ABORTED)
            return original_schedule()

        scheduler.schedule = schedule_and_abort
        run = serve(scheduler, requests, [i // 4 for i in range(24)])
    finally:
        undo()
    first_stage = [p for p in run.problems if "first stage read" in p]
    assert first_stage == []
    cut_short = 0
    for r in requests:
        positions = list(range(r.num_prompt_tokens, r.num_prompt_tokens + expected[r.request_id]))
        out = list(r.output_token_ids)
        if r.request_id in aborted:
            assert out == positions[:len(out)], r.request_id
            cut_short += len(out) < len(positions)
        else:
            assert out == positions, (r.request_id, out)
            assert r.is_finished()
    assert cut_short, "no abort landed mid-request: nothing was tested"
