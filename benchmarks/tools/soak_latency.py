"""Where a soak's latency tail comes from: TPOT by phase of the load, and the moments
most streams stalled at once (the server's stalls, to lay beside the kernels vLLM's JIT
monitor logged compiling then: ``serving_jit_events``)."""

from __future__ import annotations

from benchmarks.tools.soak_watch import SETTLE_S
from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport
from vllm_pp_cudagraph.commands.bench.stats import percentile

#: A stream waiting this long for its next chunk has stalled.
STALL_GAP_S = 1.0
#: Gaps that begin within this span of the first one are one stall.
STALL_SPAN_S = 1.0
#: A stall is the server's when at least this share of the streams then open had it.
STALL_SHARE = 0.5


def tpot_by_phase(report: LoadReport, settle_s: float = SETTLE_S) -> dict[str, dict]:
    """TPOT (ms) of the finished streamed requests whose first token came in the load's
    first ``settle_s``, and of those after: how many, p50 and p99 of each."""
    timed = [(r.chunk_times[0], r.tpot_s * 1000) for r in report.results
             if r.stream and r.completed and r.tpot_s is not None]
    start = min((first for first, _ in timed), default=0.0)
    phases = {f"first_{settle_s:.0f}_s": [t for at, t in timed if at - start < settle_s],
              f"after_{settle_s:.0f}_s": [t for at, t in timed if at - start >= settle_s]}
    return {phase: {"requests": len(tpot), "p50": round(percentile(tpot, 50), 1),
                    "p99": round(percentile(tpot, 99), 1)} for phase, tpot in phases.items()}


def stream_stalls(report: LoadReport, gap_s: float = STALL_GAP_S) -> list[dict]:
    """The moments at least half the open streams waited ``gap_s`` or more for their next
    chunk: seconds from the load's first token, how many streams stalled of how many were
    open, and the longest wait."""
    streams = [r.chunk_times for r in report.results if r.stream and len(r.chunk_times) > 1]
    if not streams:
        return []
    start = min(times[0] for times in streams)
    gaps = sorted((a, b - a, i) for i, times in enumerate(streams)
                  for a, b in zip(times, times[1:]) if b - a >= gap_s)
    stalls: list[dict] = []
    while gaps:
        at = gaps[0][0]
        this = [g for g in gaps if g[0] < at + STALL_SPAN_S]
        gaps = gaps[len(this):]
        stalled = {i for _, _, i in this}
        open_streams = sum(times[0] < at + STALL_SPAN_S and times[-1] > at for times in streams)
        if len(stalled) >= STALL_SHARE * open_streams:
            stalls.append({"at_s": round(at - start, 1), "streams": len(stalled),
                           "open": open_streams,
                           "longest_s": round(max(length for _, length, _ in this), 2)})
    return stalls


def jit_monitor_args() -> list[str]:
    """``--jit-monitor-verbose`` where the installed vLLM has it: every compile on every
    rank is logged, not only the first of each kernel on the first rank."""
    try:
        from vllm.config.observability import ObservabilityConfig
    except ImportError:
        return []
    fields = getattr(ObservabilityConfig, "__dataclass_fields__", {})
    return ["--jit-monitor-verbose"] if "jit_monitor_verbose" in fields else []
