"""Moving decodes between PP steps: the schedule each cadence makes, and every first-stage input still right.

vLLM's real ``AsyncScheduler`` at ``pipeline_parallel_size=2`` is driven the
way the engine core drives it (``pp_size + 1`` batches in flight). Each step is
also played through a first stage: vLLM's real ``PPHandler`` ring holds the
last stage's sampled tokens per step, consumed as vLLM's runner does, plus the
plugin's early consume. A request that decodes on a first stage must read the
token the last stage sampled at its previous step: that is the agreement
between the scheduler's cadence and the worker's ring that a wrong patch
breaks (the first stage would embed a stale token, with no error anywhere).
"""

from __future__ import annotations

import functools
import random
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _scheduler import drive, make_requests, make_scheduler, wrong_outputs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request
from vllm.v1.worker.gpu import pp_utils
from vllm.v1.worker.gpu.pp_utils import PendingRecv, PPHandler

from benchmarks.tools import pipeline_sim
from benchmarks.tools.pipeline_sim import PipelineClock
from vllm_pp_cudagraph.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.compat import patches
from vllm_pp_cudagraph.engine.cadence_policy import CadenceChooser
from vllm_pp_cudagraph.engine.decode_cadence import lift_idle_cadence, merge_decode_groups
from vllm_pp_cudagraph.settings import DecodeCadence, PPCudaGraphSettings
from vllm_pp_cudagraph.worker.pipeline.first_stage_tokens import (
    batch_req_indices,
    consume_entries_needed_by,
)

MAX_REQS = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_model_dir(tmp_path_factory.mktemp("model"), tokenizer=False))


def _cadence(cadence: str):
    undo = patches.apply_patch("decode-cadence", PPCudaGraphSettings(decode_cadence=cadence))
    assert undo is not None
    return undo


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


@pytest.fixture
def preemption_fix():
    undo = patches.apply_patch("async-preemption", PPCudaGraphSettings())
    yield
    if undo is not None:
        undo()


@pytest.fixture(autouse=True)
def host_copies(monkeypatch):
    # vLLM's ring copies a masked index list to the GPU through pinned memory,
    # which needs a GPU; here the "device" is the CPU.
    # (async_copy_to_gpu up to 0.29, async_tensor_h2d from 0.30)
    for name in ("async_copy_to_gpu", "async_tensor_h2d"):
        if hasattr(pp_utils, name):
            monkeypatch.setattr(pp_utils, name, lambda array, device=None: torch.from_numpy(array))


class _HostStream:
    """Stands in for the CUDA stream that waits on a broadcast: on CPU, tokens are there."""

    def wait_event(self, event) -> None:
        pass


class FirstStage:
    """A first pipeline stage's request state, fed through vLLM's ``PPHandler`` ring."""

    def __init__(self, pp_size: int, early_consume: bool):
        handler = PPHandler.__new__(PPHandler)
        handler.is_last_rank = False
        handler.device = torch.device("cpu")
        handler.main_stream = _HostStream()
        handler.queue = deque([None] * pp_size)
        handler.req_idx_gen_np = np.zeros(MAX_REQS, dtype=np.int32)
        self.handler = handler
        self.early_consume = early_consume
        self.index: dict[str, int] = {}
        self.free = list(range(MAX_REQS))
        self.last_sampled = np.full(MAX_REQS, -1, dtype=np.int64)
        #: Ring entries the plugin's early consume took before vLLM's own consume would.
        self.consumed_early = 0

    def _apply(self, outputs: dict | None) -> None:
        if outputs is None:
            return
        rows = outputs["idx_mapping"].numpy()
        for row, req_idx in enumerate(rows):
            count = int(outputs["num_sampled"][row])
            if req_idx >= 0 and count:
                self.last_sampled[req_idx] = int(outputs["sampled_tokens"][row, count - 1])

    def start_step(self, output) -> dict[str, int]:
        """What the runner does before the forward; returns each cached request's input token."""
        self._apply(self.handler.get_prev_sampled_outputs())
        if self.early_consume:
            needed = batch_req_indices(output.scheduled_cached_reqs.req_ids, self.index)
            pending = sum(entry is not None for entry in self.handler.queue)
            for outputs in consume_entries_needed_by(self.handler, needed):
                self._apply(outputs)
            self.consumed_early += pending - sum(entry is not None for entry in self.handler.queue)
        for req_id in output.finished_req_ids | (output.preempted_req_ids or set()):
            self._free(req_id)
        for data in output.scheduled_new_reqs:
            self._free(data.req_id)
            self.index[data.req_id] = self.free.pop()
        return {r: int(self.last_sampled[self.index[r]]) for r in output.scheduled_cached_reqs.req_ids}

    def _free(self, req_id: str) -> None:
        req_idx = self.index.pop(req_id, None)
        if req_idx is not None:
            self.handler.on_req_idx_freed(req_idx)
            self.free.append(req_idx)

    def receive(self, output, sampled: dict[str, int]) -> None:
        """The broadcast of the last stage's tokens for this step, as ``PPHandler.receive`` queues it."""
        ids = list(output.num_scheduled_tokens)
        if not any(r in sampled for r in ids):
            return
        idx = np.array([self.index[r] for r in ids], dtype=np.int32)
        self.handler.queue[-1] = PendingRecv(
            event=None,
            sampled_tokens=torch.tensor([[sampled.get(r, -1)] for r in ids]),
            num_sampled=torch.tensor([int(r in sampled) for r in ids]),
            num_rejected=torch.zeros(len(ids), dtype=torch.int32),
            idx_mapping=torch.from_numpy(idx),
            idx_mapping_np=idx,
            need_sampled_mask=np.array([r in sampled for r in ids]),
            gen_at_receive_np=self.handler.req_idx_gen_np[idx].copy(),
        )


class Run:
    """What one simulated serving run produced."""

    def __init__(self):
        self.requests: list[Request] = []
        self.steps: list[frozenset[str]] = []
        self.problems: list[str] = []
        self.consumed_early = 0


def serve(scheduler: AsyncScheduler, requests: list[Request], arrivals: list[int],
          early_consume: bool = True, clock: PipelineClock | None = None) -> Run:
    """Run the requests through the scheduler and a first stage; collect what went wrong.

    With ``clock``, each step is also timed on a simulated pipeline.
    """
    run = Run()
    run.requests = requests
    stage = FirstStage(scheduler.pp_size, early_consume)
    previous_token: dict[str, int | None] = {}

    def on_step(output, sampled: dict[str, int]) -> None:
        run.steps.append(frozenset(output.num_scheduled_tokens))
        for req_id, token in stage.start_step(output).items():
            expected = previous_token.get(req_id)
            if expected is not None and token != expected:
                run.problems.append(f"step {len(run.steps)} request {req_id}: first stage read "
                                    f"{token}, last stage sampled {expected}")
        for rid in output.num_scheduled_tokens:
            previous_token[rid] = sampled.get(rid)
        stage.receive(output, sampled)
        if clock is not None:
            clock.run(output)

    drive(scheduler, requests, arrivals, on_step)
    run.problems += wrong_outputs(requests)
    run.consumed_early = stage.consumed_early
    return run


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
def test_arrivals_and_preemption_keep_tokens_and_first_stage_inputs_right(model_dir, fill, preemption_fix, pp):
    problems, preemptions = problems_and_preemptions(arrivals_under_preemption(model_dir, pp))
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []


@pytest.mark.parametrize("pp", [2, 4])
def test_merged_arrivals_and_preemption_keep_tokens_and_first_stage_inputs_right(
    model_dir, merged, preemption_fix, pp
):
    problems, preemptions = problems_and_preemptions(arrivals_under_preemption(model_dir, pp))
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    assert problems == []


@pytest.mark.parametrize("pp", [2, 4])
def test_with_vllms_cadence_the_early_consume_never_acts(model_dir, preemption_fix, pp):
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
    """The hook asks the engine's plan once per scheduler: vLLM's cadence at PP=1."""
    undo = _cadence("merge")
    try:
        for pp, expected in ((2, DecodeCadence.MERGE), (1, DecodeCadence.VLLM)):
            scheduler = make_scheduler(model_dir, pp=pp)
            scheduler.schedule()
            assert scheduler._pp_cudagraph.cadence is expected
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
    model_dir, preemption_fix, pp
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


#: Model cost profiles (milliseconds): a small model whose steps cost host time whatever
#: their size, and a big one whose stages' forwards grow with the batch.
HOST_BOUND = {"host_ms": 2.0, "forward_ms": lambda n: 0.3 + 0.01 * n}
GPU_BOUND = {"host_ms": 0.3, "forward_ms": lambda n: 0.5 + 0.5 * n}

#: Each shape's PP=2 stage measured alone on one H200 (vLLM 0.33.0, stock, FULL_AND_PIECEWISE,
#: ``benchmarks/tools/stage_cost.py``): a copy of the run's ``stage_cost.json``
#: (benchmarks/results/2026-11-24-vllm033-one-gpu-stage-costs/stage-cost/).
RECORDED_STAGE_COSTS = Path(__file__).parents[1] / "data" / "stage_costs_vllm033.json"
recorded_profile = functools.partial(pipeline_sim.recorded_profile, RECORDED_STAGE_COSTS)


#: The cadence each recorded shape and context serves 256 requests faster with at PP=2:
#: the 0.6B shape's steps at short contexts are host time (one merged group); at long
#: contexts its attention makes them GPU time, as the bigger shapes' stage forwards are
#: at any (groups that overlap).
RECORDED_WINNER = {("qwen3-0.6b", 64): "merge", ("qwen3-0.6b", 1024): "balance",
                   **{(shape, context): "balance" for context in (64, 1024)
                      for shape in ("qwen3-32b", "llama-3.1-70b", "qwen3-30b-a3b")}}


def simulated_chooser(clock):
    """``auto``'s chooser measures steps on the simulated pipeline's clock."""
    from unittest import mock

    from vllm_pp_cudagraph.engine import decode_cadence

    return mock.patch.object(decode_cadence, "CadenceChooser",
                             functools.partial(CadenceChooser, clock=clock))


def timed(model_dir: str, cadence: str, profile: dict, pp: int = 2) -> tuple[Run, PipelineClock, object]:
    """Eight requests of 240 tokens arriving at once, served on a simulated pipeline."""
    clock = PipelineClock(pp, **profile)
    scheduler = make_scheduler(model_dir, num_blocks=256, pp=pp)
    requests = make_requests(8, random.Random(0), prompt=(4, 4), output=(240, 240))
    undo = _cadence(cadence) if cadence != "vllm" else (lambda: None)
    try:
        with simulated_chooser(clock):
            run = serve(scheduler, requests, [0] * 8, clock=clock)
    finally:
        undo()
    state = getattr(scheduler, "_pp_cudagraph", None)
    return run, clock, state.chooser if state is not None else None


@pytest.mark.parametrize("profile, wins, loses", [(HOST_BOUND, "merge", "balance"),
                                                  (GPU_BOUND, "balance", "merge")])
@pytest.mark.parametrize("pp", [2, 4])
def test_auto_keeps_the_cadence_that_measures_faster(model_dir, profile, wins, loses, pp):
    """On a host-bound profile merging wins, on a GPU-bound one balancing does (by
    about 2x either way); auto finds the winner within a few windows, keeps it to the
    end, and serves within 30% of the winner's time (on so short a run, the windows of
    vLLM's cadence it starts on and the trials of the others cost the rest), with every
    token right."""
    runs = {c: timed(model_dir, c, profile, pp) for c in ("auto", wins, loses)}
    assert {c: run.problems[:3] for c, (run, _, _) in runs.items()} == {c: [] for c in runs}
    end = {c: clock.end_ms for c, (_, clock, _) in runs.items()}
    assert end[wins] < 0.7 * end[loses], end
    assert end["auto"] < 1.3 * end[wins], end
    chooser = runs["auto"][2]
    assert chooser.cadence.value == wins
    # Adopted once, early (auto starts on vLLM's cadence): within seven windows (the
    # first, as the load arrives, one of the incumbent at that load, a trial of the other
    # candidate where it comes first, the winner's trial, the incumbent's again to confirm
    # it, and the switch) and the steps that re-form the groups.
    assert [c.value for _, c, *_ in chooser.switches] == [wins]
    assert all(step < 7 * chooser.window_steps + 5 * pp for step, *_ in chooser.switches), \
        chooser.switches


def served_arrivals(model_dir: str, cadence: str, profile: dict, pp: int) -> tuple[Run, PipelineClock]:
    """64 requests of 60-200 tokens arriving over 600 engine steps, at most 16 running,
    on a simulated pipeline; ``vllm`` is stock's cadence (no patch)."""
    clock = PipelineClock(pp, **profile)
    scheduler = make_scheduler(model_dir, num_blocks=1024, pp=pp, max_num_seqs=16)
    rng = random.Random(0)
    requests = make_requests(64, rng, prompt=(4, 30), output=(60, 200))
    arrivals = sorted(rng.randint(0, 600) for _ in requests)
    undo = _cadence(cadence) if cadence != "vllm" else (lambda: None)
    try:
        with simulated_chooser(clock):
            run = serve(scheduler, requests, arrivals, clock=clock)
    finally:
        undo()
    return run, clock


@pytest.mark.parametrize("profile", [HOST_BOUND, GPU_BOUND], ids=["host-bound", "gpu-bound"])
@pytest.mark.parametrize("pp", [2, 4])
def test_under_arrivals_auto_is_never_slower_than_vllms_cadence(model_dir, profile, pp):
    """Requests arriving while the engine steps, as behind ``vllm serve``: the default
    finishes the load at least as soon as stock's cadence would (the issue's floor is
    0.97x stock), and within 15% of the better fixed cadence, the rest being what its
    trials of the other one cost on a load this short."""
    runs = {c: served_arrivals(model_dir, c, profile, pp)
            for c in ("auto", "balance", "merge", "vllm")}
    assert {c: run.problems[:3] for c, (run, _) in runs.items()} == {c: [] for c in runs}
    end = {c: clock.end_ms for c, (_, clock) in runs.items()}
    assert end["auto"] <= end["vllm"], end
    assert end["auto"] < 1.15 * min(end["balance"], end["merge"]), end


@pytest.mark.parametrize("shape, context", sorted(RECORDED_WINNER))
def test_on_recorded_stage_costs_auto_keeps_the_faster_cadence(model_dir, shape, context):
    """PP=2 on each shape's recorded stage costs, 8 requests standing for 256 arriving at
    once (the seed's burst): the fixed cadence that serves them sooner is the one the costs
    predict (for the 0.6B shape that depends on the context), auto ends on it, serves
    within 20% of its time and ahead of vLLM's cadence."""
    winner = RECORDED_WINNER[shape, context]
    profile = recorded_profile(shape, context, requests_each=32)
    runs = {c: timed(model_dir, c, profile) for c in ("auto", "balance", "merge", "vllm")}
    assert {c: run.problems[:3] for c, (run, _, _) in runs.items()} == {c: [] for c in runs}
    end = {c: clock.end_ms for c, (_, clock, _) in runs.items()}
    assert min(("balance", "merge"), key=end.get) == winner, end
    assert runs["auto"][2].cadence.value == winner
    assert end["auto"] < 1.2 * end[winner], end
    # The requests arrived at once, so vLLM's cadence leaves them one group and a stage
    # idle every other step: the room stock leaves, which auto takes (1.08x to 1.6x).
    assert end["auto"] < 0.95 * end["vllm"], end


@pytest.mark.parametrize("shape, context", sorted(RECORDED_WINNER))
def test_on_recorded_stage_costs_under_arrivals_auto_keeps_pace_with_vllms_cadence(
        model_dir, shape, context):
    """The arrivals above (at most 16 running, standing for 256) on each shape's recorded
    stage costs at PP=2: auto finishes the load at no less than the issue's floor of
    0.97x vLLM's cadence's speed (level with it or ahead on the GPU-bound shapes, far
    ahead on the 0.6B shape), and within 5% of the better fixed cadence: its trials of
    the other cost no more."""
    profile = recorded_profile(shape, context, requests_each=16)
    runs = {c: served_arrivals(model_dir, c, profile, 2)
            for c in ("auto", "balance", "merge", "vllm")}
    assert {c: run.problems[:3] for c, (run, _) in runs.items()} == {c: [] for c in runs}
    end = {c: clock.end_ms for c, (_, clock) in runs.items()}
    assert 0.97 * end["auto"] <= end["vllm"], end
    assert end["auto"] < 1.05 * min(end["balance"], end["merge"]), end


def test_patch_is_undone_exactly_and_off_when_disabled():
    assert "schedule" not in AsyncScheduler.__dict__
    assert patches.apply_patch("decode-cadence", PPCudaGraphSettings(decode_cadence="vllm")) is None
    undo = patches.apply_patch("decode-cadence", PPCudaGraphSettings())
    assert AsyncScheduler.schedule.__wrapped__ is AsyncScheduler.__mro__[1].schedule
    undo()
    assert "schedule" not in AsyncScheduler.__dict__


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


def test_without_async_scheduling_the_schedule_is_vllms():
    """The cadence hook wraps the async scheduler alone; with async scheduling off vLLM
    builds its plain Scheduler, whose schedule the plugin leaves untouched."""
    from vllm.v1.core.sched.scheduler import Scheduler

    before = Scheduler.__dict__["schedule"]
    undo = _cadence("auto")
    try:
        assert Scheduler.__dict__["schedule"] is before
        assert AsyncScheduler.schedule is not before
    finally:
        undo()
