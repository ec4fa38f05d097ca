"""The snapshot files: where they live, their JSON round trip, atomic writes, tolerant reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vllm_pp_cudagraph.shared import snapshots
from vllm_pp_cudagraph.shared.snapshots import (
    METRICS_DIR_ENV,
    EngineSnapshot,
    StageSnapshot,
    ensure_metrics_dir,
    metrics_dir,
    read_engine_snapshot,
    read_snapshot,
    read_stage_snapshots,
    write_snapshot,
)

NOW = 1_700_000_000.0


def stage(number: int, **changes) -> StageSnapshot:
    values = dict(stage=number, pp_size=2, tp_size=1, time=NOW, window_s=5.0, steps=400,
                  busy_fraction=0.93, wait_fraction=0.04, step_ms=11.5,
                  handoff_bytes_total=10_000, graph_steps_total=998, eager_steps_total=2,
                  layers=14, predicted_step_ms=11.0)
    return StageSnapshot(**{**values, **changes})


def engine(**changes) -> EngineSnapshot:
    values = dict(engine=0, time=NOW, pp_size=2, cadence="balance", asked_cadence="auto",
                  cadence_switches_total=2, last_switch_reason="groups uneven",
                  group_sizes=[128, 128], running_reqs=256, layer_split=[14, 14],
                  split_reason="cost table")
    return EngineSnapshot(**{**values, **changes})


def test_round_trip() -> None:
    for snap in (stage(0), stage(1, engine=3, predicted_step_ms=None), engine()):
        assert type(snap).from_json(snap.to_json()) == snap
    assert engine().group_sizes == (128, 128)
    assert json.loads(engine().to_json())["group_sizes"] == [128, 128]


def test_unknown_keys_are_ignored_and_defaults_fill_in() -> None:
    data = json.loads(stage(0).to_json())
    del data["engine"], data["predicted_step_ms"]
    data["written_by_a_newer_version"] = {"x": 1}
    assert StageSnapshot.from_json(json.dumps(data)) == stage(0, predicted_step_ms=None)


@pytest.mark.parametrize("text", [
    "", "{not json", '{"stage": 0', "[1, 2]", "null",
    json.dumps({**json.loads(stage(0).to_json()), "stage": "zero"}),
    json.dumps({**json.loads(stage(0).to_json()), "busy_fraction": None}),
    json.dumps({k: v for k, v in json.loads(stage(0).to_json()).items() if k != "layers"}),
])
def test_from_json_refuses_what_is_not_a_snapshot(text: str) -> None:
    with pytest.raises(ValueError):
        StageSnapshot.from_json(text)


def test_a_non_finite_prediction_reads_as_none() -> None:
    assert StageSnapshot.from_json(stage(0, predicted_step_ms=float("nan")).to_json()) == stage(
        0, predicted_step_ms=None)


def test_environment_variable_names_the_directory(monkeypatch, tmp_path: Path) -> None:
    target = tmp_path / "made" / "here"
    monkeypatch.setenv(METRICS_DIR_ENV, str(target))
    assert metrics_dir() == target and target.is_dir()


def test_without_the_variable_a_temporary_directory_is_made_and_removed(monkeypatch) -> None:
    monkeypatch.setenv(METRICS_DIR_ENV, "")  # so that the variable this test sets is undone
    monkeypatch.delenv(METRICS_DIR_ENV)
    at_exit = []
    monkeypatch.setattr(snapshots.atexit, "register",
                        lambda *args, **kw: at_exit.append((args, kw)))
    made = metrics_dir()
    assert made.is_dir() and made.name.startswith("vllm-pp-cudagraph-metrics-")
    assert os.environ[METRICS_DIR_ENV] == str(made)
    assert metrics_dir() == made and len(at_exit) == 1
    (func, *args), kw = at_exit[0]
    func(*args, **kw)
    assert not made.exists()


CHILD = textwrap.dedent("""
    import subprocess, sys
    from vllm_pp_cudagraph.shared.snapshots import ensure_metrics_dir, metrics_dir
    made = ensure_metrics_dir()
    child = subprocess.run([sys.executable, "-c",
        "from vllm_pp_cudagraph.shared.snapshots import metrics_dir; print(metrics_dir())"],
        capture_output=True, text=True, check=True)
    print(made, child.stdout.strip())
""")


def test_child_processes_share_the_directory_and_only_its_creator_removes_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != METRICS_DIR_ENV}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    assert out[0] == out[1]
    assert not Path(out[0]).exists()


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path: Path) -> None:
    assert write_snapshot(stage(0), tmp_path) == tmp_path / "stage-0.json"
    assert write_snapshot(stage(0, steps=7), tmp_path) == tmp_path / "stage-0.json"
    assert write_snapshot(stage(0, engine=1), tmp_path) == tmp_path / "stage-0-engine-1.json"
    assert write_snapshot(engine(), tmp_path) == tmp_path / "engine-0.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "engine-0.json", "stage-0-engine-1.json", "stage-0.json"]
    assert read_snapshot(tmp_path / "stage-0.json", StageSnapshot).steps == 7


def test_a_failed_write_returns_none(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert write_snapshot(stage(0), blocked) is None


def test_write_defaults_to_the_metrics_directory(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path / "m"))
    write_snapshot(stage(1))
    assert read_stage_snapshots(now=NOW) == {1: stage(1)}


def test_reads_skip_stale_garbled_and_other_engines_files(tmp_path: Path) -> None:
    write_snapshot(stage(0), tmp_path)
    write_snapshot(stage(1, time=NOW - 61), tmp_path)
    write_snapshot(stage(2, engine=1), tmp_path)
    (tmp_path / "stage-3.json").write_text('{"stage": 3, "pp_si')
    (tmp_path / "stage-4.json").write_bytes(b"\xff\xfe garbage")
    (tmp_path / ".stage-5.json.x1.tmp").write_text(stage(5).to_json())
    assert read_stage_snapshots(0, tmp_path, now=NOW) == {0: stage(0)}
    assert read_stage_snapshots(0, tmp_path, max_age_s=120, now=NOW).keys() == {0, 1}
    assert read_stage_snapshots(1, tmp_path, now=NOW) == {2: stage(2, engine=1)}
    assert read_stage_snapshots(0, tmp_path / "missing", now=NOW) == {}


def test_engine_snapshot_reads(tmp_path: Path) -> None:
    assert read_engine_snapshot(0, tmp_path, now=NOW) is None
    write_snapshot(engine(), tmp_path)
    assert read_engine_snapshot(0, tmp_path, now=NOW) == engine()
    assert read_engine_snapshot(0, tmp_path, now=NOW + 61) is None
    assert read_engine_snapshot(1, tmp_path, now=NOW) is None
    (tmp_path / "engine-0.json").write_text("{}")
    assert read_engine_snapshot(0, tmp_path, now=NOW) is None


def test_fresh_by_wall_clock_by_default(tmp_path: Path) -> None:
    write_snapshot(stage(0, time=time.time()), tmp_path)
    write_snapshot(replace(engine(), time=time.time() - 3600), tmp_path)
    assert read_stage_snapshots(0, tmp_path).keys() == {0}
    assert read_engine_snapshot(0, tmp_path) is None
