"""Per-step timelines from worker traces, on a synthetic trace in torch's format."""

from __future__ import annotations

import gzip
import json

from vllm_pp_cudagraph.commands.bench.trace_analysis import analyze_dir, host_ops, steps, summarize


def x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def synthetic_trace():
    ev = [
        # step 1: a prefill (1 context request), 0..4000 us
        x("user_annotation", "execute_context_1(2)_generation_0(0)", 0, 1500),
        x("cuda_runtime", "cudaLaunchKernel", 100, 5),
        x("cuda_runtime", "cudaLaunchKernel", 200, 5),
        x("kernel", "gemm", 150, 800),
        # step 2: decode, 4000..7000 us: one graph launch, one NCCL send, one host sync
        x("user_annotation", "execute_context_0(0)_generation_128(128)", 4000, 1000),
        x("cuda_runtime", "cudaGraphLaunch", 4100, 20),
        x("cpu_op", "vllm::unified_attention_with_output", 4150, 300),
        x("cpu_op", "vllm::unified_attention_with_output", 4600, 100),
        x("kernel", "ncclDevKernel_SendRecv", 4300, 200),
        x("kernel", "triton_attn", 4200, 900),
        x("cuda_runtime", "cudaStreamSynchronize", 5500, 700),
        x("cuda_runtime", "cudaMemcpyAsync", 5600, 10),
        # step 3: empty (nothing scheduled while the batch is in flight), 7000..7500 us
        x("user_annotation", "execute_context_0(0)_generation_0(0)", 7000, 50),
        # step 4: decode, 7500..9500 us, labelled in the detailed format
        x("user_annotation", "execute_128_context_0(sq0sk0sqsq0sqsk0)_generation_128(sq128sk300sqsq128sqsk300)", 7500, 600),
        x("cuda_runtime", "cudaGraphLaunch", 7550, 20),
        x("cpu_op", "vllm::unified_attention_with_output", 7600, 200),
        x("cpu_op", "aten::copy_", 8200, 40),
        x("kernel", "triton_attn", 7600, 700),
        # step 5: start only (end unknown: not counted)
        x("user_annotation", "execute_context_0(0)_generation_128(128)", 9500, 600),
        {"ph": "i", "cat": "instant", "name": "ignored", "ts": 10},
    ]
    return {"traceEvents": ev, "distributedInfo": {"rank": 1}}


def test_steps_split_at_execute_annotations():
    s = steps(synthetic_trace())
    assert len(s) == 4
    prefill, decode1, empty, decode2 = s
    assert not prefill.decode_only and decode1.decode_only and decode2.decode_only
    assert empty.empty and not empty.decode_only and not decode1.empty
    assert (prefill.forward_ms, prefill.period_ms, prefill.kernel_launches) == (1.5, 4.0, 2)
    assert decode1.period_ms == 3.0 and decode1.outside_forward_ms == 2.0
    assert decode1.graph_launches == 1 and decode1.kernel_launches == 0
    assert decode1.nccl_ms == 0.2 and decode1.kernel_ms == 1.1
    assert (decode1.syncs, decode1.sync_ms) == (1, 0.7)  # the Async copy is not a sync


def test_summary_is_the_median_of_decode_steps():
    summary = summarize(steps(synthetic_trace()))
    assert summary["steps"] == 4 and summary["decode_steps"] == 2 and summary["empty_steps"] == 1
    assert summary["median_empty_period_ms"] == 0.5
    # a request decodes once per decode step: 4000 us -> 7500 us, across the empty step
    assert summary["median_decode_interval_ms"] == 3.5
    assert summary["median_generation_reqs"] == 128


def test_summary_splits_wall_time_by_step_kind():
    summary = summarize(steps(synthetic_trace()))
    assert (summary["prefill_steps"], summary["prefill_total_ms"]) == (1, 4.0)
    assert (summary["decode_steps"], summary["decode_total_ms"]) == (2, 5.0)
    assert (summary["empty_steps"], summary["empty_total_ms"]) == (1, 0.5)
    assert summary["median_period_ms"] == 2.5
    assert summary["median_forward_ms"] == 0.8
    assert summary["median_outside_forward_ms"] == 1.7
    assert summary["median_graph_launches"] == 1


def test_directory_of_gzipped_traces_is_keyed_by_rank(tmp_path):
    with gzip.open(tmp_path / "x_rank-1.123.pt.trace.json.gz", "wt") as f:
        json.dump(synthetic_trace(), f)
    trace = synthetic_trace()
    del trace["distributedInfo"]
    (tmp_path / "dp0_pp0_tp0_rank-0.456.pt.trace.json").write_text(json.dumps(trace))
    result = analyze_dir(tmp_path)
    assert set(result) == {"rank0", "rank1"}
    assert result["rank0"]["decode_steps"] == 2


def test_host_ops_rank_what_a_decode_step_spends_per_window():
    trace = synthetic_trace()
    decode = [s for s in steps(trace) if s.decode_only]
    ops = host_ops(trace, decode)
    forward = {op["name"]: op for op in ops["forward"]}
    # three attention calls in two decode steps, 600 us in all; the prefill's
    # launches and the step labels themselves are not counted
    assert ops["forward"][0] == {
        "name": "vllm::unified_attention_with_output", "calls": 1.5, "us": 300.0
    }
    assert forward["cudaGraphLaunch"] == {"name": "cudaGraphLaunch", "calls": 1.0, "us": 20.0}
    assert "cudaLaunchKernel" not in forward
    assert not any(op["name"].startswith("execute_") for op in ops["forward"] + ops["outside"])
    # after the forward: the sync and copy of step 2, the copy of step 4
    outside = {op["name"]: (op["calls"], op["us"]) for op in ops["outside"]}
    assert outside == {
        "cudaStreamSynchronize": (0.5, 350.0),
        "aten::copy_": (0.5, 20.0),
        "cudaMemcpyAsync": (0.5, 5.0),
    }


def test_directory_summary_carries_the_host_breakdown(tmp_path):
    (tmp_path / "rank-0.pt.trace.json").write_text(json.dumps(synthetic_trace()))
    summary = analyze_dir(tmp_path)["rank1"]
    assert summary["host_ops"]["forward"][0]["name"] == "vllm::unified_attention_with_output"
