"""Preemption under async scheduling with PP: no crash, no token lost or repeated.

Drives vLLM's real ``AsyncScheduler`` at ``pipeline_parallel_size=2`` the way the
engine core does (up to ``pp_size + 1`` batches in flight, the oldest output
processed once the queue is full) with a KV cache small enough to preempt. The
stand-in worker samples, for each request whose scheduled tokens reach the end
of what it knows, the token's own position, so a request's output must read
``prompt_len, prompt_len + 1, ...`` exactly.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from _scheduler import drive, make_requests, make_scheduler, wrong_outputs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request

from vllm_pp_cudagraph import compat
from vllm_pp_cudagraph.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.compat import patches
from vllm_pp_cudagraph.engine.async_preemption import wrap_update_after_schedule
from vllm_pp_cudagraph.settings import PPCudaGraphSettings

SEEDS = range(100)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_model_dir(tmp_path_factory.mktemp("model"), tokenizer=False))


def serve(scheduler: AsyncScheduler, seed: int) -> list[Request]:
    """Twelve requests arriving over 40 steps; run until all finish."""
    rng = random.Random(seed)
    requests = make_requests(12, rng)
    drive(scheduler, requests, [rng.randint(0, 40) for _ in requests])
    return requests


def broken_runs(model_dir: str) -> list[str]:
    problems = []
    preemptions = 0
    for seed in SEEDS:
        try:
            requests = serve(make_scheduler(model_dir), seed)
        except AssertionError:
            problems.append(f"seed {seed}: engine core assertion")
            continue
        preemptions += sum(r.num_preemptions for r in requests)
        problems += [f"seed {seed} {p}" for p in wrong_outputs(requests)]
    assert preemptions > 0, "the KV cache never ran short: nothing was tested"
    return problems


PATCH_APPLIES = compat.async_preemption_keeps_stale_placeholders(AsyncScheduler)
#: Tests of the patch itself, where it stands aside (vLLM 0.27.0+ has its own fix).
patch_applies = pytest.mark.skipif(
    not PATCH_APPLIES,
    reason="the async-preemption patch stands aside on this vLLM: it marks preempted "
    "in-flight output stale itself (0.27.0+)",
)


@pytest.fixture
def patched():
    """The plugin's fix where it applies; vLLM's own where it stands aside."""
    undo = patches.apply_patch("async-preemption", PPCudaGraphSettings())
    assert (undo is not None) == PATCH_APPLIES
    yield
    if undo is not None:
        undo()


def test_preempted_requests_finish_with_every_token_once(model_dir, patched):
    assert broken_runs(model_dir) == []


@patch_applies
def test_stock_scheduler_fails_the_same_runs(model_dir):
    problems = broken_runs(model_dir)
    assert any("assertion" in p for p in problems)
    assert any("assertion" not in p for p in problems), "expected a repeated token too"


@patch_applies
def test_reset_prefix_cache_still_discards_what_was_in_flight(model_dir, patched):
    scheduler = make_scheduler(model_dir)
    request = Request(request_id="r", prompt_token_ids=[5] * 20,
                      sampling_params=SamplingParams(max_tokens=10, ignore_eos=True), pooling_params=None)
    scheduler.add_request(request)
    scheduler.schedule()
    assert request.num_output_placeholders == 1
    scheduler.reset_prefix_cache(reset_running_requests=True)
    assert (request.async_tokens_to_discard, request.num_output_placeholders) == (1, 0)
    scheduler.schedule()  # resumed: nothing stale left to convert
    assert request.async_tokens_to_discard == 1


@patch_applies
def test_patch_is_undone_exactly():
    original = AsyncScheduler.__dict__["_update_after_schedule"]
    undo = patches.apply_patch("async-preemption", PPCudaGraphSettings())
    assert AsyncScheduler._update_after_schedule.__wrapped__ is original
    undo()
    assert AsyncScheduler.__dict__["_update_after_schedule"] is original


@patch_applies
@pytest.mark.parametrize("draft_tokens, discarded", [(0, 4), (3, 0)])
def test_a_resumed_speculative_request_keeps_its_placeholders(model_dir, draft_tokens, discarded):
    """Placeholders count frames only without draft tokens.

    A speculative frame holds one placeholder per draft token besides the sampled
    one; counting them as frames would discard that many good tokens when the
    frame returns, so a speculative request keeps vLLM's own handling.
    """
    scheduler = make_scheduler(model_dir)
    scheduler.num_spec_tokens = draft_tokens
    request = Request(request_id="r", prompt_token_ids=[5] * 20, pooling_params=None,
                      sampling_params=SamplingParams(max_tokens=10, ignore_eos=True))
    scheduler.add_request(request)
    request.num_output_placeholders = 4
    resumed = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="r")],
                              scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=[]))
    wrap_update_after_schedule(lambda self, output: None)(scheduler, resumed)
    assert request.async_tokens_to_discard == discarded
    assert request.num_output_placeholders == 4 - discarded
