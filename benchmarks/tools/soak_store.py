"""Each soak server's report on disk, so that a soak cut short can resume.

A soak of a big model starts several servers one after another; where a run
has less time than they take, the servers that finished are not run
again. Every server's report, with everything it served, goes to
``OUT/servers/MODE-RUN.json`` as it ends, beside the soak's settings that shaped
it. ``--resume`` reuses the reports found there and serves only the rest; one
saved under other settings stops the soak, naming the setting, rather than
being compared with servers that saw another load. Delete a report to serve
that server again.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, RequestResult

#: The soak settings that shape a server or its load: a report saved under other
#: values of any of them is not comparable.
RUN_SETTINGS = ("pp", "shape", "weights", "requests", "concurrency", "max_tokens", "max_num_seqs",
                "sampling_mix", "structured", "preemption", "lora", "ray", "batch_invariant",
                "plugin_runner", "same_stock_mode", "gpu_memory_utilization", "kv_cache_gib")


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
    """The saved report of one server, or None where there is none.

    Raises SystemExit where it was saved under other soak settings."""
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
