"""The writers of the per-stage metrics: a stage's clock in its worker, the engine's
record in its scheduler hook."""

from __future__ import annotations

import random

import pytest
from _scheduler import make_scheduler

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared import snapshots
from vllm_pp_cudagraph.engine_core.engine_record import group_sizes
from vllm_pp_cudagraph.worker.stage_clock import StageClock
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings


class Request:
    def __init__(self, eligible: int):
        self.next_decode_eligible_step = eligible


def test_group_sizes_count_every_running_request_once():
    running = [Request(step) for step in (4, 6, 5, 8, 7, 3)]
    assert group_sizes(running, 2) == (3, 3)
    assert sum(group_sizes(running, 4)) == len(running)


def served(tmp_path, monkeypatch, cadence: str, output: int):
    """vLLM's scheduler at PP=2 after serving 8 requests under ``cadence``, the hook's
    metrics written into a fresh directory."""
    from test_decode_cadence import make_requests, serve

    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_METRICS_DIR", str(tmp_path / "metrics"))
    model = str(write_model_dir(tmp_path / "m", tokenizer=False))
    scheduler = make_scheduler(model, num_blocks=64, pp=2,
                               settings=PPCudaGraphSettings(decode_cadence=cadence))
    serve(scheduler, make_requests(8, random.Random(1), output=(output, output)), [0] * 8)
    return scheduler


@pytest.mark.parametrize("cadence", ["balance", "merge"])
def test_the_scheduler_hook_writes_the_engines_snapshot(tmp_path, monkeypatch, cadence):
    served(tmp_path, monkeypatch, cadence, output=30)
    snap = snapshots.read_engine_snapshot(0)
    assert snap is not None and snap.cadence == cadence and snap.pp_size == 2
    assert snap.asked_cadence == cadence and sum(snap.group_sizes) == snap.running_reqs


def test_the_engine_snapshot_counts_autos_trials(tmp_path, monkeypatch):
    """What ``auto``'s probes of other cadences cost is in the engine's snapshot."""
    scheduler = served(tmp_path, monkeypatch, "auto", output=60)
    state = scheduler
    state.record._last = None  # written at most every few seconds: write the last step now
    state.record.step(scheduler.running, str(state.chooser.cadence), state.chooser)
    snap = snapshots.read_engine_snapshot(0)
    assert snap.cadence_trials_total == sum(state.chooser.trials.values()) > 0
    assert snap.cadence_trial_steps_total == sum(state.chooser.trial_steps.values()) > 0
    assert snap.cadence_wide_losses_total == sum(state.chooser.wide_losses.values())
    # And the cadences it adopted, in order: what bench reports as cadence_choices.
    assert snap.cadences_adopted == tuple(str(s[1]) for s in state.chooser.switches)
    # And how each trial ended, with what it measured.
    verdicts = state.chooser.verdicts
    assert verdicts and len(snap.recent_trials) == len(verdicts)
    for kept, verdict in zip(snap.recent_trials, verdicts):
        assert (kept["step"], kept["cadence"], kept["outcome"]) == (
            verdict.step, verdict.cadence.value, verdict.outcome)
        assert kept["against_ms"] is None or kept["against_ms"] == pytest.approx(
            1e3 * verdict.against, abs=0.01)


def test_without_metrics_the_hook_writes_nothing(tmp_path, monkeypatch):
    from test_decode_cadence import make_requests, serve

    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_METRICS_DIR", str(tmp_path / "metrics"))
    settings = PPCudaGraphSettings(decode_cadence="merge", metrics=False)
    model = str(write_model_dir(tmp_path / "m", tokenizer=False))
    serve(make_scheduler(model, num_blocks=64, pp=2, settings=settings),
          make_requests(4, random.Random(1), output=(10, 10)), [0] * 4)
    assert snapshots.read_engine_snapshot(0) is None


class GPUTimeline:
    """Events on a simulated stream: each is recorded at the stream's time and completes
    once the stream has passed it (``done`` moves that point)."""

    def __init__(self):
        self.now_ms = 0.0
        self.done_ms = 0.0

    def event(self):
        timeline, at = self, self.now_ms

        class Event:
            time_ms = at

            def query(self):
                return timeline.done_ms >= self.time_ms

            def elapsed_time(self, other):
                return other.time_ms - self.time_ms

        return Event()


def test_a_stage_clock_reads_its_events_only_once_done_and_reports_busy_and_bubble():
    gpu, written, now = GPUTimeline(), [], [0.0]
    clock = StageClock(stage=1, pp_size=2, tp_size=1, layers=14, predicted_step_ms=3.0,
                       interval_s=1.0, clock=lambda: now[0], write=written.append,
                       event=gpu.event)
    for step in range(10):  # 3 ms of work, then 1 ms idle waiting for stage 0
        clock.step_started()
        gpu.now_ms += 3.0
        clock.step_ended(graph=step > 0, handoff_bytes=1024)
        gpu.now_ms += 1.0
        gpu.done_ms = gpu.now_ms - 4.0  # the stream runs a step behind the host
        now[0] += 0.2
    assert len(written) == 1
    snap = written[0]
    assert snap.stage == 1 and snap.layers == 14 and snap.predicted_step_ms == 3.0
    assert snap.steps < 10  # the last steps were still running on the GPU
    assert snap.step_ms == pytest.approx(3.0)
    assert snap.busy_fraction == pytest.approx(0.75, abs=0.06)  # n steps, n - 1 gaps
    assert snap.busy_fraction + snap.wait_fraction == pytest.approx(1.0)
    ended = snap.graph_steps_total + snap.eager_steps_total  # totals when it was written
    assert ended >= snap.steps and snap.eager_steps_total == 1
    assert snap.handoff_bytes_total == ended * 1024
    assert (clock.graph_steps_total, clock.eager_steps_total) == (9, 1)
    # Running totals, so that a reader takes the mean over any span of snapshots.
    assert snap.timed_steps_total == snap.steps
    assert snap.busy_ms_total == pytest.approx(3.0 * snap.steps)
    assert snap.idle_ms_total == pytest.approx(1.0 * (snap.steps - 1))
    for _ in range(10):  # a second window, twice the work per step and no idle time
        clock.step_started()
        gpu.now_ms += 6.0
        clock.step_ended(graph=True)
        gpu.done_ms = gpu.now_ms
        now[0] += 0.2
    before, last = written[-2:]
    # Each window its own steps only, those before it left out; the totals run on.
    assert last.steps == last.timed_steps_total - before.timed_steps_total
    assert last.step_ms == pytest.approx(6.0)
    assert last.busy_fraction == pytest.approx(1.0)


def test_bench_reads_what_each_rank_recorded_of_its_plan(tmp_path, monkeypatch):
    """Each rank's plan record (the runner's, or the factory's where it stood aside) is
    what bench reports: ranks on the plugin's runner, direct hand-offs, the split used."""
    from types import SimpleNamespace

    from vllm_pp_cudagraph.shared import settings
    from vllm_pp_cudagraph.commands.bench.engine_run import record_findings
    from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, plan_engine
    from vllm_pp_cudagraph.shared.snapshots import PlanRecord, write_snapshot
    from vllm_pp_cudagraph.worker import model_runner

    stock = record_findings(tmp_path)  # stock vLLM writes none
    assert stock["plugin_stages"] == stock["plan_records"] == 0
    # What each rank's runner writes, from the plan it runs (a renamed key fails here).
    monkeypatch.setenv(snapshots.METRICS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(settings, "_hand_set", "15,13")
    config = make_scheduler(str(write_model_dir(tmp_path / "m", tokenizer=False)),
                            pp=2).vllm_config
    plan = plan_engine(PPCudaGraphSettings(direct_handoff=True), EngineFacts.of(config))
    monkeypatch.setattr(model_runner, "get_tp_group", lambda: SimpleNamespace(rank_in_group=0))
    for stage in (0, 1):
        monkeypatch.setattr(model_runner, "get_pp_group",
                            lambda stage=stage: SimpleNamespace(rank_in_group=stage))
        model_runner.write_plan_record(plan.record())
    write_snapshot(PlanRecord("engine-0", {"engine": {}, "workers": []}), tmp_path)
    found = record_findings(tmp_path)
    assert found == {
        "plugin_stages": 2, "stand_aside_ranks": 0, "direct_handoff_stages": 2,
        "layer_partition_used": [15, 13], "plan_records": 2, "cadence_choices": [],
        "stage_metrics": {}, "engine_metrics": None}
    # Each stage's last window, however old: bench reads it once the run is over.
    gpu = GPUTimeline()
    clock = StageClock(stage=1, pp_size=2, tp_size=1, layers=13, interval_s=0.0,
                       write=lambda snap: write_snapshot(snap, tmp_path), event=gpu.event)
    clock.step_started()
    gpu.now_ms = gpu.done_ms = 2.0
    clock.step_ended(graph=True)
    stage = record_findings(tmp_path)["stage_metrics"][1]
    assert stage["steps"] == 1 and stage["step_ms"] == 2.0 and stage["graph_steps_total"] == 1
    # And the engine core's last cadence snapshot: what auto ran and what its trials cost.
    from test_metrics_stat_logger import engine

    write_snapshot(engine(time=0.0), tmp_path)
    found = record_findings(tmp_path)
    cadence = found["engine_metrics"]
    assert cadence["cadence"] == "balance" and cadence["cadence_trial_steps_total"] == 40
    assert found["cadence_choices"] == ["merge", "balance"]


@pytest.mark.parametrize("metrics", ["1", "0"])
def test_the_engine_check_records_the_plans_it_compared(tmp_path, monkeypatch, metrics):
    """With the per-stage metrics off too: ``bench`` and ``check`` read what ran from the
    records, never from log lines."""
    from test_engine_check import ours, plan, rpc_answering

    from vllm_pp_cudagraph.engine_core.engine_check import check_workers
    from vllm_pp_cudagraph.shared.engine_plan import PLUGIN_SCHEDULER
    from vllm_pp_cudagraph.shared.snapshots import read_plan_records

    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_METRICS_DIR", str(tmp_path / "records"))
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_METRICS", metrics)
    config = make_scheduler(str(write_model_dir(tmp_path / "m", tokenizer=False)),
                            pp=2).vllm_config
    config.scheduler_config.scheduler_cls = PLUGIN_SCHEDULER  # as the API server names it
    rpc, _ = rpc_answering([ours(config), ours(config)])
    check_workers(config, rpc, plan(config, "auto"))
    engine = read_plan_records(tmp_path / "records")["engine-0"]
    assert engine["engine"]["cadence"] == "auto" and len(engine["workers"]) == 2
