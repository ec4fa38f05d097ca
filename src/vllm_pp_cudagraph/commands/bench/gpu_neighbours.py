"""Other processes computing on a run's GPUs: a run that shared its GPUs is not comparable.

Another job's kernels take the GPU's time from a run's, and in the compiled graph modes
even greedy tokens moved by near-ties on a GPU shared with another job, so ``bench``
looks before each engine starts and after it ends, when none of the run's own processes
hold the GPUs (read with ``nvidia-smi``).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_pp_cudagraph.commands.bench.nvidia_smi import query, query_visible_gpus

#: Seconds before looking again at processes found on the GPUs: an engine's workers can
#: still hold them a moment after its process ended, and only those still there count.
SETTLE_S = 5.0


def gpu_neighbours(settle_s: float = SETTLE_S) -> list[dict[str, Any]]:
    """Each process computing on the visible GPUs now and still ``settle_s`` later: its
    pid and GPU memory (MiB)."""
    found = _computing()
    if found and settle_s > 0:
        time.sleep(settle_s)
        still = {process["pid"] for process in _computing()}
        found = [process for process in found if process["pid"] in still]
    return found


def _computing() -> list[dict[str, Any]]:
    """Each process computing on the visible GPUs: its pid and GPU memory (MiB)."""
    uuids = query_visible_gpus("uuid")
    apps = query("--query-compute-apps=gpu_uuid,pid,used_memory") if uuids else None
    if not uuids or not apps:
        return []
    rows = ([cell.strip() for cell in line.split(",")] for line in apps)
    return [{"pid": int(pid), "used_mib": int(mib) if mib.isdigit() else None}
            for uuid, pid, mib in (row[:3] for row in rows if len(row) >= 3)
            if uuid in uuids and pid.isdigit()]


def merged(*samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The processes seen in any of ``samples``, once each (the first sighting's memory)."""
    seen: dict[int, dict[str, Any]] = {}
    for sample in samples:
        for process in sample:
            seen.setdefault(process["pid"], process)
    return list(seen.values())
