"""Two bench invocations side by side on one host, one per GPU set ("lanes"), meeting
before each serve point so that their runners are measured in the same minutes.

Each lane runs the same number of servers and points; before a point's warm-up a lane
leaves ``<run>-<point>.<lane>`` in the shared directory and waits until every lane has
left its own (``benchmarks/gpu_kit/run_checks.sh``'s ``lanes-*`` steps start the lanes,
``benchmarks/tools/lanes_report.py`` pairs their results)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LaneSync:
    """One lane's side of the meetings; ``runs`` counts the servers this lane has started."""

    directory: Path
    lane: str
    lanes: int = 2
    timeout_s: float = 300.0
    poll_s: float = 0.5
    runs: int = field(default=0, init=False)

    def next_run(self) -> None:
        self.runs += 1

    def meet(self, point: str) -> float | None:
        """Wait for every lane at ``point`` of the current run: the seconds waited, or None
        where the others did not come within ``timeout_s`` (this lane then goes on alone)."""
        key = f"run{self.runs}-{point}"
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{key}.{self.lane}").touch()
        start = time.monotonic()
        while len(list(self.directory.glob(f"{key}.*"))) < self.lanes:
            gone = list(self.directory.glob(f"run{self.runs}-gone.*"))
            if gone or time.monotonic() - start > self.timeout_s:
                return None
            time.sleep(self.poll_s)
        return round(time.monotonic() - start, 1)

    def leave(self) -> None:
        """This lane's current run ended without its points (its server did not serve):
        the other lanes stop waiting for it there."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"run{self.runs}-gone.{self.lane}").touch()


#: This process's lane, set from ``--lane-sync`` / ``--lane``; None outside lanes.
current: LaneSync | None = None


def configure(directory: Path | None, lane: str | None) -> None:
    global current
    current = LaneSync(directory, lane or "a") if directory is not None else None
