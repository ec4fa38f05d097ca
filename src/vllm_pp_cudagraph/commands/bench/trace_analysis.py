"""Per-step timelines from the torch.profiler traces vLLM's workers write.

vLLM's worker labels each ``execute_model`` call with a user annotation
(``execute_context_C(T)_generation_G(U)``). Between two consecutive labels
lies one step of that rank: the forward (inside the label), then sampling,
the sampled-token broadcast, and waiting for the engine and the previous
stage (after it). For every step this module measures the host time inside
and outside the forward, the GPU kernel time, kernel and graph launches,
host synchronisations and NCCL time. It summarises decode-only steps by
their median, and counts empty steps (nothing scheduled: the engine sends
those while a pipelined batch is in flight) separately, with the time from
one decode step to the next, which is what a request waits per token when
all requests decode together, and the decode batch size. Over the decode and
empty steps it gives the share of wall time the GPU spent in compute kernels
(``gpu_busy_pct``) and in NCCL (``nccl_pct``). It also splits the
wall time between prefill, decode and empty steps, and names where a decode
step's host time goes: the host operations and CUDA runtime calls inside and
after the forward, by time per step. Traces are large, so this runs where they
were written and only the summary travels.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
import statistics
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Both label formats: "execute_context_C(T)_generation_G(U)" and, with
# detailed iteration stats, "execute_N_context_C(sq..)_generation_G(sq..)".
_STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\(.*?\)_generation_(\d+)\(")
_LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
_GRAPH_LAUNCH = ("cudaGraphLaunch", "cuGraphLaunch")
_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


@dataclass(frozen=True)
class Step:
    """One ``execute_model`` step of one rank; times in milliseconds."""

    context_reqs: int
    generation_reqs: int
    start_ms: float
    forward_ms: float
    period_ms: float
    kernel_ms: float
    nccl_ms: float
    kernel_launches: int
    graph_launches: int
    syncs: int
    sync_ms: float

    @property
    def kind(self) -> str:
        """``prefill`` (any prompt tokens scheduled), ``decode`` or ``empty``."""
        return "prefill" if self.context_reqs else ("decode" if self.generation_reqs else "empty")

    @property
    def decode_only(self) -> bool:
        return self.kind == "decode"

    @property
    def empty(self) -> bool:
        return self.kind == "empty"

    @property
    def outside_forward_ms(self) -> float:
        return self.period_ms - self.forward_ms


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_rank(trace: dict[str, Any], path: Path | None = None) -> int | None:
    info = trace.get("distributedInfo") or {}
    if "rank" in info:
        return int(info["rank"])
    match = re.search(r"rank[-_]?(\d+)", path.name if path else "")
    return int(match.group(1)) if match else None


def steps(trace: dict[str, Any]) -> list[Step]:
    """Every step but the last (whose end is unknown), in order."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    marks = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and _STEP.match(e.get("name", ""))),
        key=lambda e: e["ts"],
    )
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    kernel_ts = [e["ts"] for e in kernels]
    runtime_ts = [e["ts"] for e in runtime]

    def window(items: list, stamps: list, start: float, end: float) -> list:
        return items[bisect.bisect_left(stamps, start) : bisect.bisect_left(stamps, end)]

    result = []
    for mark, following in zip(marks, marks[1:]):
        start, end = mark["ts"], following["ts"]
        in_window = window(kernels, kernel_ts, start, end)
        calls = window(runtime, runtime_ts, start, end)
        syncs = [r for r in calls if r["name"].startswith(_SYNC) and "Async" not in r["name"]]
        context_reqs, generation_reqs = map(int, _STEP.match(mark["name"]).groups())
        result.append(
            Step(
                context_reqs=context_reqs,
                generation_reqs=generation_reqs,
                start_ms=start / 1000,
                forward_ms=mark["dur"] / 1000,
                period_ms=(end - start) / 1000,
                kernel_ms=sum(k["dur"] for k in in_window) / 1000,
                nccl_ms=sum(k["dur"] for k in in_window if "nccl" in k["name"].lower()) / 1000,
                kernel_launches=sum(r["name"].startswith(_LAUNCH) for r in calls),
                graph_launches=sum(r["name"].startswith(_GRAPH_LAUNCH) for r in calls),
                syncs=len(syncs),
                sync_ms=sum(r["dur"] for r in syncs) / 1000,
            )
        )
    return result


def summarize(all_steps: list[Step]) -> dict[str, float | int]:
    """Medians over the decode-only steps, plus the empty steps and the decode interval.

    ``<kind>_steps`` and ``<kind>_total_ms`` count the steps of each kind
    (prefill, decode, empty) and the wall time they span, so a run's time can
    be split between admitting prompts, decoding and idling.
    """
    by_kind: dict[str, list[Step]] = {"prefill": [], "decode": [], "empty": []}
    for step in all_steps:
        by_kind[step.kind].append(step)
    summary: dict[str, float | int] = {"steps": len(all_steps)}
    for kind, of_kind in by_kind.items():
        summary[f"{kind}_steps"] = len(of_kind)
        summary[f"{kind}_total_ms"] = round(sum(s.period_ms for s in of_kind), 3)
    decode, empty = by_kind["decode"], by_kind["empty"]
    steady = decode + empty
    steady_ms = sum(s.period_ms for s in steady)
    if steady_ms > 0:
        # How busy this stage's GPU is while the engine decodes: compute kernels
        # over the wall time of the decode and empty steps; NCCL kernels (which
        # wait for the other stages as much as they move data) apart.
        compute_ms = sum(s.kernel_ms - s.nccl_ms for s in steady)
        summary["gpu_busy_pct"] = round(100 * compute_ms / steady_ms, 1)
        summary["nccl_pct"] = round(100 * sum(s.nccl_ms for s in steady) / steady_ms, 1)
    if empty:
        summary["median_empty_period_ms"] = round(statistics.median(s.period_ms for s in empty), 3)
    if not decode:
        return summary
    skip = {"context_reqs", "start_ms"}
    fields = [name for name in asdict(decode[0]) if name not in skip] + ["outside_forward_ms"]
    for name in fields:
        summary[f"median_{name}"] = round(statistics.median(getattr(s, name) for s in decode), 3)
    intervals = [b.start_ms - a.start_ms for a, b in zip(decode, decode[1:])]
    if intervals:
        summary["median_decode_interval_ms"] = round(statistics.median(intervals), 3)
    return summary


_HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "user_annotation")


def host_ops(
    trace: dict[str, Any], decode_steps: list[Step], top: int = 12
) -> dict[str, list[dict[str, Any]]]:
    """The host events that cost a decode step most, inside and after its forward.

    For each window (``forward``: the ``execute_model`` label; ``outside``: from
    its end to the next step) every host operation, CUDA runtime call and
    annotation is grouped by name, and the ``top`` names by time are listed with
    their calls and microseconds per decode step. Operations nest (an
    ``aten::linear`` holds its ``aten::mm``), so times overlap between names.
    """
    events = sorted(
        (
            e
            for e in trace.get("traceEvents", [])
            if e.get("ph") == "X"
            and e.get("cat") in _HOST_CATEGORIES
            and not _STEP.match(e.get("name", ""))
        ),
        key=lambda e: e["ts"],
    )
    stamps = [e["ts"] for e in events]
    windows = {
        "forward": lambda step: (step.start_ms, step.start_ms + step.forward_ms),
        "outside": lambda step: (step.start_ms + step.forward_ms, step.start_ms + step.period_ms),
    }
    n = max(len(decode_steps), 1)
    result: dict[str, list[dict[str, Any]]] = {}
    for window, bounds in windows.items():
        calls: Counter[str] = Counter()
        micros: Counter[str] = Counter()
        for step in decode_steps:
            lo, hi = (ms * 1000 for ms in bounds(step))
            for event in events[bisect.bisect_left(stamps, lo) : bisect.bisect_left(stamps, hi)]:
                calls[event["name"]] += 1
                micros[event["name"]] += event["dur"]
        result[window] = [
            {"name": name, "calls": round(calls[name] / n, 2), "us": round(total / n, 1)}
            for name, total in micros.most_common(top)
        ]
    return result


def analyze_dir(directory: Path) -> dict[str, dict[str, Any]]:
    """Summaries keyed by ``rank<N>`` (or file name) for every trace in ``directory``."""
    result = {}
    for path in sorted(directory.glob("*.pt.trace.json*")):
        trace = load_trace(path)
        rank = trace_rank(trace, path)
        all_steps = steps(trace)
        summary: dict[str, Any] = summarize(all_steps)
        summary["host_ops"] = host_ops(trace, [s for s in all_steps if s.decode_only])
        result[f"rank{rank}" if rank is not None else path.name] = summary
    return result


def stage_busy(profile: dict[str, dict[str, Any]]) -> list[float] | None:
    """Each stage's ``gpu_busy_pct``, first stage first, from :func:`analyze_dir`'s result."""
    ranks = sorted((int(name[4:]), summary) for name, summary in profile.items()
                   if name.startswith("rank") and name[4:].isdigit())
    busy = [summary.get("gpu_busy_pct") for _, summary in ranks]
    return busy if busy and None not in busy else None


if __name__ == "__main__":
    print(json.dumps(analyze_dir(Path(sys.argv[1])), indent=1))
