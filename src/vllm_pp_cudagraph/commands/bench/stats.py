"""Statistics for the benchmark: per-request latencies and run aggregation."""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def output_digest(outputs: Sequence[Any]) -> str:
    """Order-sensitive digest of per-request outputs (token lists or texts)."""
    h = hashlib.sha256()
    for output in outputs:
        h.update(json.dumps(output).encode())
    return h.hexdigest()[:16]


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class RequestTiming:
    """One request's timestamps, in seconds on the engine's monotonic clock."""

    first_token_latency: float
    first_token_ts: float
    last_token_ts: float
    num_generation_tokens: int

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; None for single-token outputs."""
        if self.num_generation_tokens < 2:
            return None
        return (self.last_token_ts - self.first_token_ts) / (self.num_generation_tokens - 1)


def summarize_requests(timings: Sequence[RequestTiming]) -> dict[str, float]:
    """TTFT mean / p99 and TPOT mean / p50 / p99, in milliseconds."""
    ttft = [t.first_token_latency * 1000 for t in timings]
    tpot = [t.tpot * 1000 for t in timings if t.tpot is not None]
    return {
        "ttft_mean_ms": statistics.fmean(ttft) if ttft else math.nan,
        "ttft_p99_ms": percentile(ttft, 99),
        "tpot_mean_ms": statistics.fmean(tpot) if tpot else math.nan,
        "tpot_p50_ms": percentile(tpot, 50),
        "tpot_p99_ms": percentile(tpot, 99),
    }


def median_run(runs: Sequence[dict], key: str = "elapsed_s") -> dict:
    """The timed run with the median ``key`` (lower median for even counts)."""
    if not runs:
        raise ValueError("no timed runs")
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def spread_pct(runs: Sequence[dict]) -> float | None:
    """(slowest - fastest) / fastest elapsed time over the timed runs, in percent."""
    if len(runs) < 2:
        return None
    times = [r["elapsed_s"] for r in runs]
    return round(100 * (max(times) - min(times)) / min(times), 1)


_CAPTURE = re.compile(r"Graph capturing finished in (\d+(?:\.\d+)?) secs, took (-?\d+(?:\.\d+)?) GiB")


def capture_stats(log: str) -> dict[str, float | None]:
    """Slowest stage's capture time and largest graph memory, from vLLM's log lines."""
    found = [(float(s), float(g)) for s, g in _CAPTURE.findall(log)]
    if not found:
        return {"capture_s": None, "graph_gib": None}
    return {"capture_s": max(s for s, _ in found), "graph_gib": max(g for _, g in found)}
