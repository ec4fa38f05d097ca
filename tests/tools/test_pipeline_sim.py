"""benchmarks/tools/pipeline_sim.py: closed-loop serve passes on vLLM's real scheduler."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.tools import pipeline_sim
from benchmarks.tools.pipeline_sim import PipelineClock, cadence_on_clock, serve_passes
from benchmarks.tools.scheduler_hook_cost import empty_scheduler
from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

STAGE_COSTS = Path(__file__).parents[1] / "data" / "stage_costs_vllm033.json"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_model_dir(tmp_path_factory.mktemp("model"), tokenizer=False))


def test_each_pass_serves_its_requests_at_the_concurrency_and_drains(model_dir):
    clock = PipelineClock(2, host_ms=1.0, forward_ms=lambda tokens: 1.0 + 0.01 * tokens)
    scheduler = empty_scheduler(model_dir, 16, 8, 20)
    running = []
    schedule = scheduler.schedule

    def counted():
        running.append(len(scheduler.running) + len(scheduler.waiting))
        return schedule()

    scheduler.schedule = counted
    rates = serve_passes(scheduler, clock, [16, 40], concurrency=16, input_len=8, output_len=20)
    assert len(rates) == 2 and all(r > 0 for r in rates)
    assert max(running) == 16
    assert not scheduler.running and not scheduler.waiting and not scheduler.requests


def test_requests_arriving_at_once_leave_vllms_cadence_a_stage_idle_which_auto_takes(
        model_dir):
    """128 requests whose prompts prefill in one step form one decode group under vLLM's
    cadence; on the 32B stage costs ``auto`` adopts ``balance`` and serves more."""
    args = argparse.Namespace(pp=2, stage_costs=STAGE_COSTS, shape="qwen3-32b", context=64,
                              concurrency=128, pass_requests=128, passes=1, input_len=64,
                              output_len=64)
    runs = {c: pipeline_sim.simulate(model_dir, c, args) for c in ("vllm", "auto")}
    assert runs["vllm"]["trials"] is None
    assert [c for _, c in runs["auto"]["switches"]] == ["balance"]
    assert runs["auto"]["pass_req_per_s"][0] > 1.05 * runs["vllm"]["pass_req_per_s"][0]


def test_the_cadence_hook_is_undone_after_a_simulation():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    clock = PipelineClock(2, host_ms=1.0, forward_ms=lambda tokens: 1.0)
    with cadence_on_clock("auto", clock):
        assert "schedule" in AsyncScheduler.__dict__
    assert "schedule" not in AsyncScheduler.__dict__
