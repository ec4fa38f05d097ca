"""Each soak server's report on disk (``OUT/servers/MODE-RUN.json``, with the settings that
shaped it), so that a soak cut short resumes: ``--resume`` serves only the servers without
one, and stops, naming the setting, at one saved under other settings."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, RequestResult

#: The soak settings that shape a server or its load: reports saved under others differ.
RUN_SETTINGS = ("pp", "shape", "weights", "requests", "concurrency", "max_tokens", "max_num_seqs",
                "sampling_mix", "structured", "preemption", "lora", "plugin_runner",
                "gpu_memory_utilization")


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in RUN_SETTINGS}


def report_path(out: Path, mode: str, tag: str) -> Path:
    return out / "servers" / f"{mode}-{tag.replace('_', '-')}.json"


def save_report(out: Path, mode: str, tag: str, report: dict, settings: dict[str, Any]) -> Path:
    """Write one server's report (its load report in full) for a later ``--resume``."""
    record = dict(report, settings=settings)
    if isinstance(report.get("load_report"), LoadReport):
        record["load_report"] = asdict(report["load_report"])
    path = report_path(out, mode, tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, default=str))
    tmp.replace(path)  # a soak cut off mid-write leaves no half report behind
    return path


def load_report(out: Path, mode: str, tag: str, settings: dict[str, Any]) -> dict | None:
    """The saved report of one server, or None; SystemExit where other settings made it."""
    path = report_path(out, mode, tag)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    saved = record.pop("settings", {})
    changed = [f"--{name.replace('_', '-')} {saved.get(name)!r} there, {value!r} now"
               for name, value in settings.items() if saved.get(name) != value]
    if changed:
        raise SystemExit(f"--resume: {path} was served under other settings ({'; '.join(changed)}). "
                         "Run with the same settings, or delete it to serve that server again.")
    load = record.get("load_report")
    if isinstance(load, dict):
        record["load_report"] = LoadReport(
            results=[RequestResult(**result) for result in load["results"]],
            **{k: v for k, v in load.items() if k != "results"})
    return record
