"""The stat-logger plugin: Prometheus series and log line from the snapshot files.

vLLM's real ``StatLoggerBase``, ``SchedulerStats`` and ``VllmConfig`` and the real
prometheus_client, with a fresh registry per test.
"""

from __future__ import annotations

import json
import os
import re
import time
import tomllib
import types
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from vllm.config import DeviceConfig, ParallelConfig, VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import SchedulerStats

from conftest import run_python
from vllm_pp_cudagraph.api_server import stat_logger
from vllm_pp_cudagraph.shared.snapshots import EngineSnapshot, StageSnapshot, write_snapshot
from vllm_pp_cudagraph.api_server.stat_logger import (
    METRIC_NAMES,
    PREFIX,
    STAGE_COUNTERS,
    STAGE_GAUGES,
    PipelineStatLogger,
    PipelineView,
    format_log_line,
)

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "examples" / "grafana" / "vllm-pp-cudagraph-dashboard.json"
STAGE_SERIES = [PREFIX + n for n in STAGE_GAUGES] + [PREFIX + "stage_reporting"] + [
    PREFIX + n + "_total" for n in STAGE_COUNTERS]


def config(pp: int = 2, dp: int = 1) -> VllmConfig:
    return VllmConfig(
        parallel_config=ParallelConfig(pipeline_parallel_size=pp, data_parallel_size=dp),
        device_config=DeviceConfig(device="cpu"))


def stage(number: int, **changes) -> StageSnapshot:
    values = dict(stage=number, pp_size=2, tp_size=1, time=time.time(), window_s=5.0,
                  steps=400, busy_fraction=0.93 + number / 25, wait_fraction=0.04 - number / 100,
                  step_ms=11.5 + number,
                  handoff_bytes_total=10_000 + number, graph_steps_total=998 + number,
                  eager_steps_total=2, layers=14 + number, predicted_step_ms=11.0 + number)
    return StageSnapshot(**{**values, **changes})


def engine(**changes) -> EngineSnapshot:
    values = dict(engine=0, time=time.time(), pp_size=2, cadence="balance",
                  asked_cadence="auto", cadence_switches_total=2, last_switch_reason=None,
                  cadence_trials_total=7, cadence_trial_steps_total=40,
                  cadence_wide_losses_total=3, cadences_adopted=["merge", "balance"],
                  group_sizes=[128, 128], running_reqs=256, layer_split=[14, 15],
                  split_reason="cost table")
    return EngineSnapshot(**{**values, **changes})


@pytest.fixture
def env(monkeypatch, tmp_path: Path) -> types.SimpleNamespace:
    """Plugin enabled, a snapshot directory, a fresh registry and a logger factory."""
    monkeypatch.setenv("VLLM_PLUGINS", "pp_cudagraph")
    registry = CollectorRegistry()

    def make(engine_index: int = 0, vllm_config: VllmConfig | None = None) -> PipelineStatLogger:
        return PipelineStatLogger(vllm_config or config(), engine_index,
                                  registry=registry, directory=tmp_path)

    return types.SimpleNamespace(dir=tmp_path, registry=registry, make=make)


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, engine: str = "0", **labels: str) -> float | None:
    return samples.get((PREFIX + name, frozenset({"engine": engine, **labels}.items())))


def series(samples: dict, name: str) -> set[frozenset]:
    return {labels for n, labels in samples if n == name}


def test_is_a_vllm_stat_logger(env) -> None:
    logger = env.make()
    assert isinstance(logger, StatLoggerBase)
    logger.record(SchedulerStats(), None, engine_idx=0)
    logger.log_engine_initialized()


def test_every_series_for_both_stages(env) -> None:
    from vllm_pp_cudagraph.shared.heartbeats import Heartbeat, heartbeat_path

    write_snapshot(stage(0), env.dir)
    write_snapshot(stage(1), env.dir)
    write_snapshot(engine(), env.dir)
    for n in (0, 1):
        Heartbeat(heartbeat_path(env.dir, 0, n, 0), n, 0)
    env.make()
    samples = scrape(env.registry)
    for name in STAGE_SERIES:
        got = {dict(labels).get("stage") for labels in series(samples, name)}
        assert got == {"0", "1"}, name
    for n in (0, 1):
        s = {"stage": str(n)}
        assert value(samples, "stage_busy_ratio", **s) == pytest.approx(0.93 + n / 25)
        assert value(samples, "stage_wait_ratio", **s) == pytest.approx(0.04 - n / 100)
        assert value(samples, "stage_step_seconds", **s) == pytest.approx((11.5 + n) / 1e3)
        assert value(samples, "stage_predicted_step_seconds", **s) == pytest.approx((11 + n) / 1e3)
        assert value(samples, "stage_layers", **s) == 14 + n
        assert value(samples, "stage_reporting", **s) == 1
        assert value(samples, "stage_handoff_bytes_total", **s) == 10_000 + n
        assert value(samples, "stage_graph_steps_total", **s) == 998 + n
        assert value(samples, "stage_eager_steps_total", **s) == 2
    assert value(samples, "decode_group_size", group="0") == 128
    assert value(samples, "decode_group_size", group="1") == 128
    assert value(samples, "running_requests") == 256
    assert value(samples, "cadence", cadence="balance", asked="auto") == 1
    assert value(samples, "cadence_switches_total") == 2
    assert value(samples, "cadence_trials_total") == 7
    assert value(samples, "cadence_trial_steps_total") == 40
    assert value(samples, "cadence_wide_losses_total") == 3
    assert {name for name, _ in samples} == set(METRIC_NAMES)


def test_a_silent_stage_shows(env) -> None:
    write_snapshot(stage(0), env.dir)
    logger = env.make()
    samples = scrape(env.registry)
    assert value(samples, "stage_reporting", stage="0") == 1
    assert value(samples, "stage_reporting", stage="1") == 0
    assert value(samples, "stage_busy_ratio", stage="1") is None
    assert "stage 1 silent" in format_log_line(logger.view)


def test_a_stage_without_steps_for_two_windows_reads_idle_not_its_last_window(env) -> None:
    """A stage writes only while it steps: between bursts its last busy window must not
    stand for the idle time after it."""
    write_snapshot(stage(0, time=time.time() - stat_logger.IDLE_AFTER_S - 5), env.dir)
    write_snapshot(stage(1, time=time.time() - 1), env.dir)
    logger = env.make()
    samples = scrape(env.registry)
    assert value(samples, "stage_reporting", stage="0") == 1
    assert value(samples, "stage_busy_ratio", stage="0") == 0
    assert value(samples, "stage_wait_ratio", stage="0") == 0
    assert value(samples, "stage_step_seconds", stage="0") is None
    assert value(samples, "stage_graph_steps_total", stage="0") == 998
    assert value(samples, "stage_busy_ratio", stage="1") == pytest.approx(0.97)
    line = format_log_line(logger.view)
    assert line.startswith("Pipeline: stage 0 idle; stage 1 busy 97%, waits 3%;")


def test_the_stage_count_also_comes_from_the_snapshots(env) -> None:
    write_snapshot(stage(0), env.dir)
    env.make(vllm_config=config(pp=1))
    assert value(scrape(env.registry), "stage_reporting", stage="1") == 0


def test_null_prediction_leaves_its_sample_out(env) -> None:
    write_snapshot(stage(0, predicted_step_ms=None), env.dir)
    write_snapshot(stage(1), env.dir)
    env.make()
    samples = scrape(env.registry)
    assert value(samples, "stage_predicted_step_seconds", stage="0") is None
    assert value(samples, "stage_predicted_step_seconds", stage="1") is not None


def test_stale_and_garbled_snapshots_are_ignored(env) -> None:
    write_snapshot(stage(0), env.dir)
    write_snapshot(stage(1, time=time.time() - 120), env.dir)
    (env.dir / "engine-0.json").write_text('{"engine": 0, "time": ')
    env.make()
    samples = scrape(env.registry)
    assert value(samples, "stage_reporting", stage="1") == 0
    assert value(samples, "stage_busy_ratio", stage="1") is None
    assert value(samples, "running_requests") is None
    (env.dir / "stage-1.json").write_bytes(b"\x00\x01 not json")
    assert value(scrape(env.registry), "stage_reporting", stage="1") == 0


def test_counters_stay_monotonic_across_a_worker_restart(env) -> None:
    logger = env.make()
    seen = []
    for graphs, switches in ((1000, 3), (10, 0), (25, 1)):  # restarted after 1000 and 3
        write_snapshot(stage(0, graph_steps_total=graphs), env.dir)
        write_snapshot(engine(cadence_switches_total=switches,
                              cadence_trial_steps_total=10 * switches), env.dir)
        logger.refresh()
        samples = scrape(env.registry)
        seen.append((value(samples, "stage_graph_steps_total", stage="0"),
                     value(samples, "cadence_switches_total"),
                     value(samples, "cadence_trial_steps_total")))
    assert seen == [(1000, 3, 30), (1010, 3, 30), (1025, 4, 40)]


def test_a_stage_gone_stale_keeps_its_counter(env) -> None:
    logger = env.make()
    write_snapshot(stage(0), env.dir)
    logger.refresh()
    (env.dir / "stage-0.json").unlink()
    logger.refresh()
    samples = scrape(env.registry)
    assert value(samples, "stage_graph_steps_total", stage="0") == 998
    assert value(samples, "stage_busy_ratio", stage="0") is None


def test_cadence_info_keeps_earlier_cadences_at_zero(env) -> None:
    logger = env.make()
    write_snapshot(engine(), env.dir)
    logger.refresh()
    write_snapshot(engine(cadence="fill", cadence_switches_total=3), env.dir)
    logger.refresh()
    samples = scrape(env.registry)
    assert value(samples, "cadence", cadence="balance", asked="auto") == 0
    assert value(samples, "cadence", cadence="fill", asked="auto") == 1


def test_record_rereads_at_most_once_a_second(env, monkeypatch) -> None:
    clock = types.SimpleNamespace(monotonic=lambda: 100.0, time=time.time)
    monkeypatch.setattr(stat_logger, "time", clock)
    logger = env.make()
    write_snapshot(stage(0, steps=1), env.dir)
    logger.record(SchedulerStats(), None)
    write_snapshot(stage(0, steps=2), env.dir)
    logger.record(SchedulerStats(), None)
    assert logger.view.stages[0].steps == 1
    clock.monotonic = lambda: 101.0
    logger.record(SchedulerStats(), None)
    assert logger.view.stages[0].steps == 2


def test_log_line_for_two_stages() -> None:
    view = PipelineView(engine=0, pp_size=2, stages={
        0: stage(0, busy_fraction=0.93, wait_fraction=0.04),
        1: stage(1, busy_fraction=0.97, wait_fraction=0.01,
                 graph_steps_total=998, eager_steps_total=2)},
        engine_snapshot=engine())
    assert format_log_line(view) == (
        "Pipeline: stage 0 busy 93%, waits 4%; stage 1 busy 97%, waits 1%; "
        "cadence balance (asked auto, 2 switches, 7 trials of 40 steps), "
        "groups 128/128; "
        "graphs 99.8% of steps")
    assert format_log_line(PipelineView(engine=0, pp_size=2)) is None


def test_log_says_one_line_and_nothing_before_any_snapshot(env, monkeypatch) -> None:
    lines = []
    monkeypatch.setattr(stat_logger.logger, "info", lambda msg, *args: lines.append(msg % args))
    logger = env.make(vllm_config=config(dp=2))
    logger.log()
    assert lines == []
    write_snapshot(stage(0), env.dir)
    write_snapshot(stage(1), env.dir)
    logger.refresh()
    logger.log()
    assert len(lines) == 1 and lines[0].startswith("Engine 000: Pipeline: stage 0 busy")


def test_registration_is_idempotent_across_loggers(env) -> None:
    write_snapshot(stage(0), env.dir)
    write_snapshot(stage(0, engine=1), env.dir)
    env.make(0)
    env.make(1)
    text = generate_latest(env.registry).decode()
    assert text.count(f"# TYPE {PREFIX}stage_busy_ratio gauge") == 1
    samples = scrape(env.registry)
    assert value(samples, "stage_busy_ratio", engine="1", stage="0")
    assert value(samples, "stage_busy_ratio", engine="0", stage="0")


def test_vllms_registry_takes_it_once_and_vllm_leaves_it_there(monkeypatch, tmp_path) -> None:
    from vllm.v1.metrics.prometheus import unregister_vllm_metrics

    monkeypatch.setenv("VLLM_PLUGINS", "pp_cudagraph")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    ours = []
    try:
        PipelineStatLogger(config(), 0, directory=tmp_path)
        PipelineStatLogger(config(), 1, directory=tmp_path)
        unregister_vllm_metrics()
        ours += [c for c in REGISTRY._collector_to_names
                 if isinstance(c, stat_logger._PipelineCollector)]
        assert len(ours) == 1
    finally:
        for collector in ours:
            REGISTRY.unregister(collector)
        stat_logger._collectors.pop(REGISTRY, None)


def test_several_api_servers_keep_the_log_line(monkeypatch, tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, vLLM's /metrics reads only multiprocess files."""
    monkeypatch.setenv("VLLM_PLUGINS", "pp_cudagraph")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "prom"))
    before = set(REGISTRY._collector_to_names)
    logger = PipelineStatLogger(config(), 0, directory=tmp_path)
    assert set(REGISTRY._collector_to_names) == before
    write_snapshot(stage(0), tmp_path)
    logger.refresh()
    assert format_log_line(logger.view).startswith("Pipeline: stage 0 busy")


def test_of_several_api_servers_only_the_first_logs_the_line(env, monkeypatch) -> None:
    """Under ``vllm serve --api-server-count 4`` each API server makes a logger; the line
    is the engine's, so it is logged once every 10 s, not four times."""
    lines = []
    monkeypatch.setattr(stat_logger.logger, "info", lambda msg, *args: lines.append(msg % args))
    write_snapshot(stage(0), env.dir)
    for rank in range(4):
        vllm_config = config()
        vllm_config.parallel_config._api_process_count = 4
        vllm_config.parallel_config._api_process_rank = rank
        env.make(vllm_config=vllm_config).log()
    assert len(lines) == 1 and lines[0].startswith("Pipeline: stage 0 busy")


def test_inert_unless_the_plugin_is_enabled(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_PLUGINS", "something_else")
    monkeypatch.delenv("VLLM_PP_CUDAGRAPH_METRICS_DIR", raising=False)
    registry = CollectorRegistry()
    logger = PipelineStatLogger(config(), 0, registry=registry)
    logger.record(SchedulerStats(), None)
    logger.log()
    assert generate_latest(registry) == b""
    assert "VLLM_PP_CUDAGRAPH_METRICS_DIR" not in os.environ


def test_inert_with_the_metrics_turned_off(monkeypatch, tmp_path: Path) -> None:
    """Nothing measures then, so no stage may be reported silent."""
    monkeypatch.setenv("VLLM_PLUGINS", "pp_cudagraph")
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_METRICS", "0")
    registry = CollectorRegistry()
    logger = PipelineStatLogger(config(), 0, registry=registry, directory=tmp_path)
    logger.record(SchedulerStats(), None)
    assert generate_latest(registry) == b""


def test_entry_point_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.stat_logger_plugins"] == {
        "pp_cudagraph": "vllm_pp_cudagraph.api_server.stat_logger:PipelineStatLogger"}


LOAD = """
import json
from vllm.plugins import load_plugins_by_group
from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories
plugins = load_plugins_by_group("vllm.stat_logger_plugins")
print(json.dumps({name: f"{c.__module__}:{c.__qualname__}" for name, c in plugins.items()}
                 | {"factories": len(load_stat_logger_plugin_factories())}))
"""


def test_vllm_loads_it_with_vllm_plugins_naming_the_plugin() -> None:
    installed = {e.name for e in entry_points(group="vllm.stat_logger_plugins")}
    if "pp_cudagraph" not in installed:
        pytest.skip("the installed metadata lacks the entry point: reinstall (pip install -e .)")
    report, _ = run_python(LOAD, {"VLLM_PLUGINS": "pp_cudagraph"})
    assert report == {"pp_cudagraph": "vllm_pp_cudagraph.api_server.stat_logger:PipelineStatLogger",
                      "factories": 1}


def dashboard_exprs(node) -> list[str]:
    if isinstance(node, dict):
        return [e for k, v in node.items()
                for e in ([v] if k == "expr" else dashboard_exprs(v))]
    if isinstance(node, list):
        return [e for item in node for e in dashboard_exprs(item)]
    return []


def test_dashboard_queries_only_series_the_logger_exposes() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard)
    assert exprs
    used = set()
    for expr in exprs:
        names = set(re.findall(r"vllm[\w]*:[\w:]+", expr))
        assert names, expr
        assert names <= set(METRIC_NAMES), (expr, names - set(METRIC_NAMES))
        used |= names
    assert used == set(METRIC_NAMES)
    variables = {v["name"]: v["type"] for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"] == "datasource"
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${DS_PROMETHEUS}"}


def test_each_stage_shows_the_seconds_since_its_slowest_rank_completed_a_step(env) -> None:
    from vllm_pp_cudagraph.shared.heartbeats import Heartbeat, heartbeat_path

    clock = [100.0]
    ranks = {(stage, tp): Heartbeat(heartbeat_path(env.dir, 0, stage, tp), stage, tp,
                                    clock=lambda: clock[0])
             for stage in (0, 1) for tp in (0, 1)}
    clock[0] = time.monotonic() - 30.0  # stage 1's TP rank 1 finished its step 30 s ago
    ranks[1, 1].begin()
    ranks[1, 1].step_done()
    for key in ((0, 0), (0, 1), (1, 0)):
        clock[0] = time.monotonic() - 2.0
        ranks[key].begin()
        ranks[key].step_done()
    env.make()
    samples = scrape(env.registry)
    assert value(samples, "stage_seconds_since_step", stage="0") == pytest.approx(2.0, abs=1.0)
    assert value(samples, "stage_seconds_since_step", stage="1") == pytest.approx(30.0, abs=1.0)
