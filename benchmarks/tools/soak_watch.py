"""What a soak watches on one server while its load runs (GPU memory, each pipeline stage's
snapshots, the requests left once the load ends), and what it judges (:func:`watch_problems`):
GPU memory flat after the load's first :data:`SETTLE_S`, and the plugin's first requests
taking no more than stock's; no stage silent for :data:`SILENT_S`; no request left.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.shared.snapshots import read_stage_snapshots

#: How much a GPU's used memory may grow from the load's first minute to its end.
MEMORY_GROWTH_MIB = 512
#: How long into the load memory is taken as settled: vLLM (stock alike) allocates
#: workspaces on its first requests.
SETTLE_S = 60.0
#: How long a stage's snapshot may stand still under load (a stage writes every 5 s).
SILENT_S = 30.0
#: How long requests may take to leave the server once the load has ended.
DRAIN_S = 10.0


def gpu_memory_mib(gpus: str) -> dict[str, int] | None:
    """Used memory (MiB) of each GPU in ``gpus``; None where ``nvidia-smi`` cannot say."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
             "-i", gpus], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split(",") for line in out.strip().splitlines() if "," in line]
    return {index.strip(): int(float(used)) for index, used in rows} or None


def requests_in_server(metrics_text: str) -> int | None:
    """Requests running or waiting, from ``/metrics`` text; None where it does not say."""
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    values = [float(line.rsplit(None, 1)[1]) for line in metrics_text.splitlines()
              if (line.split("{", 1)[0].split() or [""])[0] in names]
    return int(sum(values)) if values else None


@dataclass
class ServerWatch:
    """Samples one server while its load runs: :meth:`start` once it is healthy,
    :meth:`finish` once the load is done."""

    gpus: str
    records: Path
    pp_size: int
    interval_s: float = 10.0
    samples: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.samples.append(self._sample())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append(self._sample())

    def _sample(self) -> dict[str, Any]:
        stages = read_stage_snapshots(directory=self.records, max_age_s=float("inf"))
        return {"time": time.time(), "gpu_mib": gpu_memory_mib(self.gpus),
                "stages": {str(s): {"time": snap.time, "steps": snap.steps,
                                    "busy": round(snap.busy_fraction, 3)}
                           for s, snap in sorted(stages.items())}}

    def finish(self, base_url: str) -> dict[str, Any]:
        """Stop sampling and say what the server held once the load ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        under_load = list(self.samples)
        deadline = time.monotonic() + DRAIN_S
        while True:
            try:
                with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as resp:
                    left = requests_in_server(resp.read().decode(errors="replace"))
            except OSError:
                left = None
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        end = self._sample()
        return {"pp_size": self.pp_size, "samples": [*under_load, end],
                "under_load": len(under_load), "requests_left": left}


def _settled(watch: dict[str, Any]) -> dict[str, Any]:
    """The first sample taken :data:`SETTLE_S` into the load (the last one under load
    where the load was shorter)."""
    under_load = watch["samples"][:watch["under_load"]] or watch["samples"][:1]
    start = under_load[0]["time"]
    return next((s for s in under_load if s["time"] - start >= SETTLE_S), under_load[-1])


def _growth(before: dict | None, after: dict | None) -> dict[str, int]:
    if not before or not after:
        return {}
    return {gpu: after[gpu] - used for gpu, used in before.items() if gpu in after}


def _in_order(per_gpu: dict[str, int]) -> list[tuple[str, int]]:
    return sorted(per_gpu.items(), key=lambda item: int(item[0]))


def first_traffic_problems(plugin: dict[str, Any] | None,
                           stock: dict[str, Any] | None) -> list[str]:
    """Where the plugin's server took more memory on its first requests than stock's on
    the same stream, stage by stage (their GPUs may differ: they pair in order)."""
    if not plugin or not stock:
        return []
    # Each GPU's growth from the server's first sample to the settled one, in GPU order.
    ours, theirs = [_in_order(_growth(watch["samples"][0]["gpu_mib"], _settled(watch)["gpu_mib"]))
                    for watch in (plugin, stock)]
    return [f"GPU {gpu}: its first {SETTLE_S:.0f} s of load took {took} MiB, stock's "
            f"{stock_took} MiB (at most {MEMORY_GROWTH_MIB} more)"
            for (gpu, took), (_, stock_took) in zip(ours, theirs)
            if took > stock_took + MEMORY_GROWTH_MIB]


def _silences(watch: dict[str, Any]) -> dict[str, float]:
    """The longest stretch under load in which each stage's snapshot stood still."""
    under_load = watch["samples"][:watch["under_load"]]
    longest: dict[str, float] = {}
    for stage in {s for sample in under_load for s in sample["stages"]}:
        last_move, last_time = None, None
        for sample in under_load:
            written = sample["stages"].get(stage, {}).get("time")
            if written != last_time:
                last_move, last_time = sample["time"], written
            if last_move is not None:
                longest[stage] = max(longest.get(stage, 0.0), sample["time"] - last_move)
    return longest


def watch_problems(watch: dict[str, Any] | None, plugin: bool,
                   stock: dict[str, Any] | None = None) -> list[str]:
    """What a finished watch says went wrong (stage snapshots, and the first requests'
    memory against ``stock``'s watch on the same stream, only where the plugin ran)."""
    if not watch:
        return ["no watch of the server while its load ran"]
    problems = [f"GPU {gpu}: memory grew by {grew} MiB after the load's first "
                f"{SETTLE_S:.0f} s (at most {MEMORY_GROWTH_MIB})"
                for gpu, grew in _growth(_settled(watch)["gpu_mib"],
                                         watch["samples"][-1]["gpu_mib"]).items()
                if grew > MEMORY_GROWTH_MIB]
    if watch.get("requests_left"):
        problems.append(f"{watch['requests_left']} requests still running or waiting "
                        f"{DRAIN_S:.0f} s after the load ended")
    if plugin:
        seen = {s for sample in watch["samples"] for s in sample["stages"]}
        problems += [f"stage {stage} wrote no snapshot" for stage in range(watch["pp_size"])
                     if str(stage) not in seen]
        problems += [f"stage {stage} went silent for {quiet:.0f} s under load"
                     for stage, quiet in sorted(_silences(watch).items()) if quiet > SILENT_S]
        problems += first_traffic_problems(watch, stock)
    return problems


def watch_summary(watch: dict[str, Any] | None) -> dict[str, Any] | None:
    """The figures a soak report keeps of a watch."""
    if not watch:
        return None
    samples = watch["samples"]
    return {"gpu_mib_start": samples[0]["gpu_mib"],
            "gpu_mib_settled": _settled(watch)["gpu_mib"],
            "gpu_mib_end": samples[-1]["gpu_mib"], "samples": len(samples),
            "longest_stage_silence_s": {s: round(q, 1)
                                        for s, q in sorted(_silences(watch).items())},
            "requests_left": watch.get("requests_left")}
