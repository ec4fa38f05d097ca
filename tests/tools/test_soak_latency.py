"""Where a soak's latency tail comes from: stalls every stream shared, and kernels
vLLM compiled while serving."""

from __future__ import annotations

from _serve_parser import parse_serve_args
from test_soak_slots import _served, _soak_args

from benchmarks.tools.soak import mode_result
from benchmarks.tools.soak_latency import jit_monitor_args, stream_stalls
from vllm_pp_cudagraph.commands.bench.engine_run import serving_jit_events
from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, RequestResult


def _stream(index: int, times: list[float], **kwargs) -> RequestResult:
    return RequestResult(index, stream=True, chunk_times=times, **kwargs)


def _ticks(start: float, end: float, step: float = 0.05, pause: tuple | None = None):
    """Chunk times from ``start`` to ``end``; ``pause`` (at, seconds) holds one chunk back."""
    times, t = [], start
    while t < end:
        times.append(t)
        t += step
        if pause and times[-1] <= pause[0] < t:
            t += pause[1]
    return times


def _load(*streams: RequestResult) -> LoadReport:
    return LoadReport(list(streams), elapsed_s=60.0, health_checks=1, health_failures=[])


def test_a_stall_most_open_streams_share_is_reported_with_when_and_how_long():
    # Five streams open at 30 s; four of them wait 2-2.4 s from 30-30.5 s on.
    streams = [_stream(i, _ticks(10.0 + i, 50.0, pause=(30.0 + 0.01 * i, 2.4)))
               for i in range(3)]
    streams.append(_stream(3, _ticks(12.0, 50.0)))
    streams.append(_stream(4, _ticks(40.0, 45.0)))  # not open at 30 s
    streams.append(_stream(5, _ticks(30.5, 40.0, pause=(30.5, 2.0))))  # its first wait
    assert stream_stalls(_load(*streams)) == [
        {"at_s": 20.0, "streams": 4, "open": 5, "longest_s": 2.45}]


def test_waits_few_of_the_open_streams_had_are_no_stall():
    # Two of six open streams wait at 10 s (their clients', say); a third on its own.
    streams = [_stream(i, _ticks(0.0, 20.0, pause=(10.0, 3.0))) for i in range(2)]
    streams.append(_stream(2, _ticks(0.0, 20.0, pause=(15.0, 3.0))))
    streams += [_stream(i, _ticks(0.0, 20.0)) for i in range(3, 6)]
    streams.append(_stream(6, [1.0, 9.0], cancelled=True))  # its client went quiet, then cancelled
    assert stream_stalls(_load(*streams)) == []
    assert stream_stalls(_load(RequestResult(0, stream=False, text="a"))) == []


def test_each_runs_stalls_are_in_the_soaks_result():
    stalled = _load(*[_stream(i, _ticks(0.0, 10.0, pause=(5.0, 1.5))) for i in range(4)])
    texts = ["a b", "c d"]
    reports = {name: _served(0, texts) for name in ("plugin", "stock_a", "stock_b")}
    reports["plugin"]["load_report"] = stalled
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert [s["streams"] for s in result["plugin"]["stalls"]] == [4]
    assert result["stock_a"]["stalls"] == []


def test_every_compile_after_warm_up_is_read_from_the_log_with_its_rank_and_time():
    log = "\n".join([
        "(Worker_PP0 pid=2266) INFO 11-28 21:54:44 [jit_monitor.py:84] Kernel JIT monitor "
        "activated; monitored JIT compilations during inference will use mode=warn.",
        "(Worker_PP0 pid=2266) WARNING 11-28 21:54:48 [jit_monitor.py:140] Triton kernel JIT "
        "compilation during inference: kernel_unified_attention. This causes a latency "
        "spike; consider extending warmup to cover this shape/config.",
        "(Worker_PP1_TP1 pid=2269) WARNING 11-28 21:57:01 [jit_monitor.py:137] Triton kernel "
        "JIT compilation during inference: _lora_shrink_kernel (constants: M=64). This "
        "causes a latency spike; consider extending warmup to cover this shape/config.",
        "(APIServer pid=1585) INFO 11-28 21:57:07 [loggers.py:335] Engine 000: Running: 256",
        "WARNING 11-28 21:57:09 [jit_monitor.py:140] Triton kernel JIT compilation during "
        "inference: _topk_kernel. This causes a latency spike.",
    ])
    assert serving_jit_events(log) == [
        {"process": "Worker_PP0", "time": "11-28 21:54:48", "kernel": "kernel_unified_attention"},
        {"process": "Worker_PP1_TP1", "time": "11-28 21:57:01", "kernel": "_lora_shrink_kernel"},
        {"process": None, "time": "11-28 21:57:09", "kernel": "_topk_kernel"}]


def test_the_jit_monitor_flag_is_one_this_vllm_serve_accepts(monkeypatch):
    import vllm.platforms

    # vLLM's parser builds its config defaults, which infer a device type; there is none here.
    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    args = jit_monitor_args()
    parsed = parse_serve_args(["model", *args])
    assert getattr(parsed, "jit_monitor_verbose", False) == bool(args)
