"""Files through which stages and engine cores report metrics to the API server; stdlib only."""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

METRICS_DIR_ENV = "VLLM_PP_CUDAGRAPH_METRICS_DIR"
INTERVAL_S = 5.0  # seconds between two snapshots of a stage or an engine
DEFAULT_MAX_AGE_S = 60.0
KEPT_SWITCHES = 64  # the most cadence switches an engine snapshot lists
logger = logging.getLogger("vllm.pp_cudagraph.metrics")
_write_failed_logged = False
#: The directory this process made (the settings, read earlier, do not name it).
_made_here: str | None = None
#: A field type's JSON values and name in errors (others: ``X | None``, ``tuple[X, ...]``).
_JSON_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "int": (int, "an integer"), "float": ((int, float), "a finite number"),
    "str": (str, "a string"), "dict[str, Any]": (dict, "an object")}
S = TypeVar("S", bound="_Snapshot")


def ensure_metrics_dir() -> Path:
    """The metrics directory (``VLLM_PP_CUDAGRAPH_METRICS_DIR``), created if needed; without
    the setting, a temporary one, set for the processes started here and removed at exit."""
    global _made_here
    from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings, set_variable
    if configured := _made_here or PPCudaGraphSettings.current().metrics_dir:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        return path
    _made_here = tempfile.mkdtemp(prefix="vllm-pp-cudagraph-metrics-")
    set_variable(METRICS_DIR_ENV, _made_here)
    atexit.register(shutil.rmtree, _made_here, ignore_errors=True)
    return Path(_made_here)


metrics_dir = ensure_metrics_dir


def _read_field(type_name: str, value: Any) -> Any:
    """``value`` as a field of type ``type_name``; ValueError where it is not one."""
    # A non-finite prediction means no prediction; it must not drop the whole snapshot.
    if type_name == "float | None" and isinstance(value, float) and not math.isfinite(value):
        return None
    if type_name.endswith(" | None"):
        return None if value is None else _read_field(type_name.removesuffix(" | None"), value)
    if type_name.startswith("tuple["):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, got {value!r}")
        item_type = type_name.removeprefix("tuple[").removesuffix(", ...]")
        return tuple(_read_field(item_type, item) for item in value)
    kinds, expected = _JSON_TYPES[type_name]
    if (isinstance(value, bool) or not isinstance(value, kinds)
            or isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"expected {expected}, got {value!r}")
    return float(value) if type_name == "float" else value


class _Snapshot:
    """JSON round trip shared by the snapshot dataclasses."""

    def to_json(self) -> str:
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls: type[S], data: str | bytes | Mapping[str, Any]) -> S:
        """Parse a snapshot, ignoring unknown keys; ValueError where it is not of this schema."""
        if not isinstance(data, Mapping):
            data = json.loads(data)
            if not isinstance(data, dict):
                raise ValueError("a snapshot is a JSON object")
        values = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            if field.name in data:
                try:
                    values[field.name] = _read_field(str(field.type), data[field.name])
                except ValueError as exc:
                    raise ValueError(f"{field.name}: {exc}") from None
            elif field.default is dataclasses.MISSING:
                raise ValueError(f"{field.name} is missing")
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class StageSnapshot(_Snapshot):
    """One pipeline stage's measurements over its last window, written by its TP rank 0."""

    stage: int
    pp_size: int
    tp_size: int
    engine: int = 0
    time: float
    window_s: float
    steps: int
    busy_fraction: float
    wait_fraction: float
    step_ms: float
    handoff_bytes_total: int
    graph_steps_total: int
    eager_steps_total: int
    #: Totals since the stage started, so a reader takes means between two snapshots.
    timed_steps_total: int = 0
    busy_ms_total: float = 0.0
    idle_ms_total: float = 0.0
    layers: int
    predicted_step_ms: float | None = None

    @property
    def filename(self) -> str:
        # Engine 0 keeps the short name; other engines (data parallel) need their own files.
        suffix = "" if self.engine == 0 else f"-engine-{self.engine}"
        return f"stage-{self.stage}{suffix}.json"


@dataclass(frozen=True, kw_only=True)
class EngineSnapshot(_Snapshot):
    """An engine core's decode cadence, decode groups and layer split, written by the core."""

    engine: int
    time: float
    pp_size: int
    cadence: str
    asked_cadence: str
    cadence_switches_total: int
    last_switch_reason: str | None = None
    #: ``auto``'s trials of another cadence, the steps they scheduled, and those lost widely.
    cadence_trials_total: int = 0
    cadence_trial_steps_total: int = 0
    cadence_wide_losses_total: int = 0
    #: The cadences ``auto`` adopted, in order (at most the last :data:`KEPT_SWITCHES`).
    cadences_adopted: tuple[str, ...] = ()
    #: How ``auto``'s latest trials ended (``engine_record.trial_record``), oldest first.
    recent_trials: tuple[dict[str, Any], ...] = ()
    group_sizes: tuple[int, ...]
    running_reqs: int
    layer_split: tuple[int, ...]
    split_reason: str

    def __post_init__(self) -> None:
        # Callers pass lists; the frozen snapshot keeps tuples.
        for name in ("group_sizes", "cadences_adopted", "recent_trials", "layer_split"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def filename(self) -> str:
        return f"engine-{self.engine}.json"


@dataclass(frozen=True)
class PlanRecord:
    """One rank's plan record (``plan-<stage>-<tp rank>.json``), or the engine check's."""

    name: str
    record: Mapping[str, Any]
    kind: ClassVar[str] = "plan"  # the file name's first word

    @property
    def filename(self) -> str:
        return f"{self.kind}-{self.name}.json"

    def to_json(self) -> str:
        return json.dumps(dict(self.record), separators=(",", ":"))


@dataclass(frozen=True)
class CaptureRecord(PlanRecord):
    """One rank's CUDA-graph capture beside the plugin's pre-KV-cache estimate, for the soak."""

    kind: ClassVar[str] = "graphs"


def read_capture_records(directory: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Every readable capture record in ``directory`` by (stage, TP rank)."""
    found = read_plan_records(directory, CaptureRecord.kind)
    return {(int(ranks[1]), int(ranks[2])): record for name, record in found.items()
            if (ranks := re.fullmatch(r"([0-9]+)-([0-9]+)", name))}


def read_plan_records(directory: Path, kind: str = PlanRecord.kind) -> dict[str, dict[str, Any]]:
    """Every readable record of ``kind`` in ``directory`` by name (``0-0``, ``engine-0``)."""
    records = {}
    for path in sorted(Path(directory).glob(f"{kind}-*.json")):
        try:
            records[path.stem.removeprefix(f"{kind}-")] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return records


def write_snapshot(snapshot: StageSnapshot | EngineSnapshot | PlanRecord,
                   directory: Path | None = None) -> Path | None:
    """Write ``snapshot`` atomically into ``directory``; its path, or None where that failed
    (logged once per process): metrics must never stop a worker or an engine core."""
    global _write_failed_logged
    directory = metrics_dir() if directory is None else Path(directory)
    target = directory / snapshot.filename
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{snapshot.filename}.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            out.write(snapshot.to_json())
        os.replace(tmp, target)
        return target
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if not _write_failed_logged:
            _write_failed_logged = True
            logger.warning("Could not write pipeline metrics to %s: %s", target, exc)
        return None


def read_snapshot(path: Path, kind: type[S]) -> S | None:
    """The snapshot in ``path``, or None where it is missing, partial or not of ``kind``."""
    try:
        return kind.from_json(Path(path).read_bytes())
    except (OSError, ValueError, TypeError):
        return None


def _fresh(written: float, max_age_s: float, now: float | None) -> bool:
    return (time.time() if now is None else now) - written <= max_age_s


def read_stage_snapshots(engine: int = 0, directory: Path | None = None,
                         max_age_s: float = DEFAULT_MAX_AGE_S,
                         now: float | None = None) -> dict[int, StageSnapshot]:
    """Fresh stage snapshots of ``engine``, by stage; unreadable or stale files are skipped."""
    directory = metrics_dir() if directory is None else Path(directory)
    found: dict[int, StageSnapshot] = {}
    for path in sorted(directory.glob("stage-*.json")):
        snap = read_snapshot(path, StageSnapshot)
        if snap is None or snap.engine != engine or not _fresh(snap.time, max_age_s, now):
            continue
        if snap.stage not in found or found[snap.stage].time < snap.time:
            found[snap.stage] = snap
    return found


def read_engine_snapshot(engine: int = 0, directory: Path | None = None,
                         max_age_s: float = DEFAULT_MAX_AGE_S,
                         now: float | None = None) -> EngineSnapshot | None:
    """The fresh snapshot of ``engine``, or None where it is missing, unreadable or stale."""
    directory = metrics_dir() if directory is None else Path(directory)
    snap = read_snapshot(directory / f"engine-{engine}.json", EngineSnapshot)
    fresh = snap is not None and snap.engine == engine and _fresh(snap.time, max_age_s, now)
    return snap if fresh else None
