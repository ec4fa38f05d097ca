"""vLLM stat-logger plugin (``vllm.stat_logger_plugins``: ``pp_cudagraph``): the stages' and
engine cores' snapshots as ``vllm_pp_cudagraph:*`` Prometheus series and one log line."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.heartbeats import read_beats
from vllm_pp_cudagraph.shared.snapshots import (INTERVAL_S, EngineSnapshot, StageSnapshot,
                                                metrics_dir, read_engine_snapshot,
                                                read_stage_snapshots)
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings, environment_value, is_enabled

logger = init_logger("vllm.pp_cudagraph.metrics")

PREFIX = "vllm_pp_cudagraph:"
REFRESH_INTERVAL_S = 1.0
#: A stage writes at its first step 5 s into a window, so a snapshot older than two windows
#: means the stage ran no step for at least one: it reports idle, not its last busy window.
IDLE_AFTER_S = 2 * INTERVAL_S
_STAGE = ["engine", "stage"]

#: Per-stage gauges: name -> (help, value from the snapshot; None leaves the sample out).
STAGE_GAUGES: dict[str, tuple[str, Callable[[StageSnapshot], float | None]]] = {
    "stage_busy_ratio": ("Fraction of the window the stage's GPU ran its steps.",
                         lambda s: s.busy_fraction),
    "stage_wait_ratio": ("Fraction of the window the stage's GPU sat idle between its "
                         "steps (the pipeline bubble: on the stages after the first, mostly "
                         "waiting for the previous stage's tensors).", lambda s: s.wait_fraction),
    "stage_step_seconds": ("Mean GPU time of one step of the stage, in seconds.",
                           lambda s: s.step_ms / 1e3 if s.steps else None),
    "stage_predicted_step_seconds": (
        "Predicted decode-step time of the stage at the engine's max_num_seqs, in seconds.",
        lambda s: None if s.predicted_step_ms is None else s.predicted_step_ms / 1e3),
    "stage_layers": ("Decoder layers on the stage.", lambda s: s.layers),
}
#: Per-stage counters: name (without ``_total``) -> (help, cumulative snapshot field).
STAGE_COUNTERS: dict[str, tuple[str, str]] = {
    "stage_handoff_bytes": ("Bytes of intermediate tensors the stage sent.",
                            "handoff_bytes_total"),
    "stage_graph_steps": ("Steps the stage replayed from a CUDA graph.", "graph_steps_total"),
    "stage_eager_steps": ("Steps the stage ran eagerly.", "eager_steps_total"),
}
#: Per-engine counters, likewise: the cadence's switches and what ``auto``'s trials cost.
ENGINE_COUNTERS: dict[str, tuple[str, str]] = {
    "cadence_switches": ("Switches of the decode cadence.", "cadence_switches_total"),
    "cadence_trials": ("Trials auto made of another decode cadence.", "cadence_trials_total"),
    "cadence_trial_steps": ("Steps scheduled under a trial cadence.", "cadence_trial_steps_total"),
    "cadence_wide_losses": ("Trials that lost widely, backed off for longer.",
                            "cadence_wide_losses_total"),
}


@dataclass(frozen=True)
class PipelineView:
    """What one engine's pipeline reported at the last refresh; counters already monotonic."""

    engine: int
    pp_size: int
    stages: Mapping[int, StageSnapshot] = field(default_factory=dict)
    engine_snapshot: EngineSnapshot | None = None
    #: (snapshot counter field, stage or None for the engine's) -> total, every stage ever seen.
    totals: Mapping[tuple[str, int | None], int] = field(default_factory=dict)
    #: Every (cadence, asked cadence) pair reported so far, in order.
    cadences: tuple[tuple[str, str], ...] = ()
    #: Stage -> seconds since its slowest rank on this host last completed a step (heartbeats).
    since_step: Mapping[int, float] = field(default_factory=dict)


def metric_families(views: list[PipelineView]) -> list[Metric]:
    """The Prometheus families for ``views``; every family, even without samples."""
    families: list[Metric] = []
    for name, (doc, value_of) in STAGE_GAUGES.items():
        family = GaugeMetricFamily(PREFIX + name, doc, labels=_STAGE)
        for view in views:
            for stage, snap in sorted(view.stages.items()):
                if (value := value_of(snap)) is not None:
                    family.add_metric([str(view.engine), str(stage)], value)
        families.append(family)
    reporting = GaugeMetricFamily(PREFIX + "stage_reporting", "1 while the stage's snapshot is "
                                  "fresh, 0 for an expected stage that went silent.", labels=_STAGE)
    for view in views:
        for stage in range(view.pp_size):
            reporting.add_metric([str(view.engine), str(stage)], int(stage in view.stages))
    families.append(reporting)
    since = GaugeMetricFamily(
        PREFIX + "stage_seconds_since_step",
        "Seconds since the stage (its slowest rank on this host) last completed a serving "
        "step; grows while the server is idle, and while the stage is stuck.", labels=_STAGE)
    for view in views:
        for stage, seconds in sorted(view.since_step.items()):
            since.add_metric([str(view.engine), str(stage)], seconds)
    families.append(since)
    families.extend(_counter_families(STAGE_COUNTERS, _STAGE, views))
    families.extend(_engine_gauges(views))
    families.extend(_counter_families(ENGINE_COUNTERS, ["engine"], views))
    return families


def _counter_families(counters: Mapping[str, tuple[str, str]], labels: list[str],
                      views: list[PipelineView]) -> list[Metric]:
    """A family per counter from ``views``' totals: a stage's, or the engine's (stage None)."""
    families = []
    for name, (doc, total_field) in counters.items():
        family = CounterMetricFamily(PREFIX + name, doc, labels=labels)
        for view in views:
            for (key, stage), total in sorted(view.totals.items()):
                if key == total_field:
                    stage_label = [] if stage is None else [str(stage)]
                    family.add_metric([str(view.engine), *stage_label], total)
        families.append(family)
    return families


def _engine_gauges(views: list[PipelineView]) -> list[Metric]:
    groups = GaugeMetricFamily(PREFIX + "decode_group_size", "Running decode requests in each "
                               "decode group, last step.", labels=["engine", "group"])
    running = GaugeMetricFamily(PREFIX + "running_requests", "Running requests in the engine's "
                                "last scheduled step.", labels=["engine"])
    cadence = GaugeMetricFamily(PREFIX + "cadence", "1 for the decode cadence in effect, 0 for "
                                "those before.", labels=["engine", "cadence", "asked"])
    for view in views:
        engine, snap = str(view.engine), view.engine_snapshot
        if snap is not None:
            for group, size in enumerate(snap.group_sizes):
                groups.add_metric([engine, str(group)], size)
            running.add_metric([engine], snap.running_reqs)
        current = None if snap is None else (snap.cadence, snap.asked_cadence)
        for pair in view.cadences:
            cadence.add_metric([engine, *pair], int(pair == current))
    return [groups, running, cadence]


#: Every series name the logger exposes, as written in the exposition text.
METRIC_NAMES: tuple[str, ...] = tuple(
    family.name + "_total" if family.type == "counter" else family.name
    for family in metric_families([]))


def format_log_line(view: PipelineView) -> str | None:
    """The one-line summary of ``view``, or None where nothing has reported."""
    if not view.stages and view.engine_snapshot is None:
        return None
    parts = []
    for stage in range(max(view.pp_size, max(view.stages, default=-1) + 1)):
        snap = view.stages.get(stage)
        parts.append(f"stage {stage} silent" if snap is None else
                     f"stage {stage} idle" if not snap.steps else
                     f"stage {stage} busy {snap.busy_fraction:.0%}, waits {snap.wait_fraction:.0%}")
    if (snap := view.engine_snapshot) is not None:
        switches = snap.cadence_switches_total
        parts.append(
            f"cadence {snap.cadence} (asked {snap.asked_cadence}, {switches} "
            f"switch{'' if switches == 1 else 'es'}, {snap.cadence_trials_total} "
            f"trial{'' if snap.cadence_trials_total == 1 else 's'} of "
            f"{snap.cadence_trial_steps_total} steps), "
            f"groups {'/'.join(map(str, snap.group_sizes)) or '-'}")
    graphs = sum(s.graph_steps_total for s in view.stages.values())
    steps = graphs + sum(s.eager_steps_total for s in view.stages.values())
    if steps:
        parts.append(f"graphs {100 * graphs / steps:.1f}% of steps")
    return "Pipeline: " + "; ".join(parts)


def idle_marked(snap: StageSnapshot, now: float) -> StageSnapshot:
    """``snap``, or where it is :data:`IDLE_AFTER_S` old, a window of no steps since it."""
    if now - snap.time <= IDLE_AFTER_S:
        return snap
    return replace(snap, window_s=now - snap.time, steps=0, busy_fraction=0.0,
                   wait_fraction=0.0, predicted_step_ms=None)


def seconds_since_step(directory: Path, engine: int) -> dict[int, float]:
    now = time.monotonic()
    since: dict[int, float] = {}
    for beat in read_beats(directory, engine):
        since[beat.stage] = max(since.get(beat.stage, 0.0), round(now - beat.done_at, 3))
    return since


class _PipelineCollector(Collector):
    """Yields every engine's latest families at scrape time, so counters come straight from
    the snapshots and a stage that stops reporting leaves the scrape instead of freezing."""

    def __init__(self) -> None:
        self.loggers: dict[int, PipelineStatLogger] = {}

    def collect(self) -> list[Metric]:
        loggers = list(self.loggers.values())
        for stat_logger in loggers:
            stat_logger.maybe_refresh()
        return metric_families([stat_logger.view for stat_logger in loggers])

    def describe(self) -> list[Metric]:
        return metric_families([])


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, _PipelineCollector] = (
    weakref.WeakKeyDictionary())
_registration_lock = threading.Lock()
_logged_once: set[str] = set()


def _log_once(key: str, message: str, *args: object) -> None:
    if key not in _logged_once:
        _logged_once.add(key)
        logger.info(message, *args)


class PipelineStatLogger(StatLoggerBase):
    """One engine's pipeline metrics for Prometheus and vLLM's stats log; inert unless metrics
    are on and ``VLLM_PLUGINS`` names the plugin (vLLM loads every installed one where unset)."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0, *,
                 registry: CollectorRegistry | None = None, directory: Path | None = None) -> None:
        parallel = vllm_config.parallel_config
        self.engine_index = engine_index
        self.view = PipelineView(engine=engine_index, pp_size=parallel.pipeline_parallel_size)
        self._prefix = f"Engine {engine_index:03d}: " if parallel.data_parallel_size > 1 else ""
        #: (counter field, stage) -> (what the writer counted before its last restart, its latest).
        self._totals: dict[tuple[str, int | None], tuple[int, int]] = {}
        self._cadences: dict[tuple[str, str], None] = {}
        self._lock = threading.Lock()
        self._next_refresh = 0.0
        #: Each of ``--api-server-count N``'s API servers has one: the first logs the line.
        self._logs_line = vllm_surface.api_server_rank(vllm_config) == 0
        self.active = is_enabled() and PPCudaGraphSettings.current().metrics
        if not self.active:
            return
        self.directory = metrics_dir() if directory is None else Path(directory)
        if registry is None and not environment_value("PROMETHEUS_MULTIPROC_DIR"):
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            registry = get_prometheus_registry()
        if registry is None:  # /metrics carries only multiprocess files
            _log_once("multiproc", "Pipeline metrics: with several API servers the "
                      "vllm_pp_cudagraph:* series are not exported at /metrics; the stats "
                      "log line still shows them.")
            return
        with _registration_lock:
            if (collector := _collectors.get(registry)) is None:
                collector = _PipelineCollector()
                registry.register(collector)
                _collectors[registry] = collector
        collector.loggers[engine_index] = self

    def record(self, scheduler_stats: Any, iteration_stats: Any,
               mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
        self.maybe_refresh()

    def maybe_refresh(self) -> None:
        if self.active and time.monotonic() >= self._next_refresh:
            self.refresh()

    def refresh(self) -> None:
        with self._lock:
            self._next_refresh = time.monotonic() + REFRESH_INTERVAL_S
            now = time.time()
            stages = {stage: idle_marked(snap, now) for stage, snap in
                      read_stage_snapshots(self.engine_index, self.directory).items()}
            snap = read_engine_snapshot(self.engine_index, self.directory)
            self.view = replace(self._next_view(stages, snap),
                                since_step=seconds_since_step(self.directory, self.engine_index))

    def _count(self, key: str, stage: int | None, raw: int) -> None:
        """Take a writer's count; one below its last means the writer restarted from zero."""
        base, last = self._totals.get((key, stage), (0, 0))
        self._totals[key, stage] = (base + last if raw < last else base, raw)

    def _next_view(self, stages: dict[int, StageSnapshot],
                   snap: EngineSnapshot | None) -> PipelineView:
        for stage, stage_snap in stages.items():
            for _, key in STAGE_COUNTERS.values():
                self._count(key, stage, getattr(stage_snap, key))
        pp_size = max([self.view.pp_size, *(s.pp_size for s in stages.values())])
        if snap is not None:
            for _, key in ENGINE_COUNTERS.values():
                self._count(key, None, getattr(snap, key))
            self._cadences[snap.cadence, snap.asked_cadence] = None
            pp_size = max(pp_size, snap.pp_size)
        totals = {key: base + last for key, (base, last) in self._totals.items()}
        return PipelineView(engine=self.engine_index, pp_size=pp_size, stages=stages,
                            engine_snapshot=snap, totals=totals, cadences=tuple(self._cadences))

    def log(self) -> None:
        if self._logs_line:
            self.maybe_refresh()
            if (line := format_log_line(self.view)) is not None:
                logger.info("%s%s", self._prefix, line)

    def log_engine_initialized(self) -> None:
        if self.active:
            _log_once("dir", "Pipeline metrics: reading stage snapshots from %s", self.directory)
