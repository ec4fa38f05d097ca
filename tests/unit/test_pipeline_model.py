"""The pipeline model behind ``plan``: how a layout's delivery follows from its stages' costs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.planning.pipeline_model import (
    LINKS,
    SERVE_INTAKE_S,
    TTFT_P50_SHARE,
    Workload,
    intake_s,
    pipeline,
    plugin_auto,
    tensor_parallel,
)
from vllm_pp_cudagraph.shared.stage_costs import ModelShape, StageCosts

SHAPE_32B = ModelShape.from_config(SHAPES["qwen3-32b"])
NVLINK = LINKS["nvlink"]
#: Large enough that the host's time per step never sets the pace.
GPU_BOUND = Workload(concurrency=256, input_len=1, output_len=256, max_num_seqs=256)


def fixed_costs(layer_ms: float, head_ms: float = 0.0):
    """Costs that do not depend on the batch, so only the schedule differs."""
    def costs_at(batch: int) -> StageCosts:
        return StageCosts(batch, layer_ms / 1e3, 0.0, head_ms / 1e3, 0, 0, "test")
    return costs_at


@pytest.mark.parametrize("cadence", ["balance", "merge", "stock"])
def test_a_stage_that_costs_twice_as_much_halves_the_pipelines_rate(cadence):
    split = (32, 32)
    base = pipeline(SHAPE_32B, split, GPU_BOUND, cadence, NVLINK, fixed_costs(1.0))
    double = pipeline(SHAPE_32B, split, GPU_BOUND, cadence, NVLINK, fixed_costs(2.0))
    # Prefill and the KV reads stay as they were, so "half" within a few percent.
    assert double.req_per_s == pytest.approx(base.req_per_s / 2, rel=0.05)


def linear_costs(layer_ms_per_request: float):
    def costs_at(batch: int) -> StageCosts:
        return StageCosts(batch, batch * layer_ms_per_request / 1e3, 0.0, 0.0, 0, 0, "test")
    return costs_at


def test_balance_at_two_groups_keeps_both_stages_busy_where_merge_keeps_each_half():
    split = (32, 32)
    balance = pipeline(SHAPE_32B, split, GPU_BOUND, "balance", NVLINK, fixed_costs(1.0))
    merge = pipeline(SHAPE_32B, split, GPU_BOUND, "merge", NVLINK, fixed_costs(1.0))
    assert min(balance.busy) > 0.95
    assert max(merge.busy) < 0.55


def test_balance_gains_what_a_step_of_twice_the_requests_costs_more():
    """merge runs N requests through both stages in turn (2 f(N) a token), balance two
    groups of N/2 at once (2 f(N/2)): a tie where a step costs the same at any batch
    (reading weights), twice the rate where it grows with the batch (FLOPs)."""
    def ratio(costs) -> float:
        balance = pipeline(SHAPE_32B, (32, 32), GPU_BOUND, "balance", NVLINK, costs)
        merge = pipeline(SHAPE_32B, (32, 32), GPU_BOUND, "merge", NVLINK, costs)
        return balance.req_per_s / merge.req_per_s
    assert ratio(fixed_costs(1.0)) == pytest.approx(1.0, abs=0.03)
    assert ratio(linear_costs(0.05)) == pytest.approx(2.0, rel=0.05)


def test_the_slower_stage_sets_balances_pace():
    even = pipeline(SHAPE_32B, (32, 32), GPU_BOUND, "balance", NVLINK, fixed_costs(1.0))
    uneven = pipeline(SHAPE_32B, (40, 24), GPU_BOUND, "balance", NVLINK, fixed_costs(1.0))
    assert uneven.req_per_s < even.req_per_s
    assert uneven.busy[0] == pytest.approx(1.0, abs=0.02) and uneven.busy[1] < 0.65


def test_memory_bound_layers_make_tps_advantage_grow_as_batches_shrink():
    """Each stage reads its weights once per group, TP's ranks read half of them once per
    step: at few requests that is TP's advantage; at many, the matrix products' FLOPs
    weigh the same either way."""
    def tp_over_pp(running: int) -> float:
        work = Workload(running, 64, 256, max_num_seqs=running)
        pp = plugin_auto(SHAPE_32B, (32, 32), work, NVLINK)
        return tensor_parallel(SHAPE_32B, 2, work, NVLINK).req_per_s / pp.req_per_s
    assert tp_over_pp(4) > tp_over_pp(64) > tp_over_pp(1024)
    # Launches and all-reduces keep TP=2 short of twice PP=2's pace, but clearly ahead.
    assert tp_over_pp(4) > 1.25


def test_a_slow_link_costs_tp_more_than_pp():
    """TP pays two all-reduces a layer, PP one hand-off a stage."""
    def tp_over_pp(link: str) -> float:
        pp = plugin_auto(SHAPE_32B, (32, 32), GPU_BOUND, LINKS[link])
        return tensor_parallel(SHAPE_32B, 2, GPU_BOUND, LINKS[link]).req_per_s / pp.req_per_s
    assert tp_over_pp("socket") < tp_over_pp("host") < tp_over_pp("nvlink")


def test_auto_is_predicted_on_vllms_cadence_unless_another_wins_by_its_margin():
    """As ``auto`` runs: the 32B shape's groups of 256 keep vLLM's cadence (no other
    predicted 5% faster; at 2 requests ``merge`` is, but by less than the margin); the
    launch-bound 0.6B shape at 128 short requests runs ``merge``, far faster there."""
    for running in (2, 512):
        work = Workload(running, 64, 256, max_num_seqs=running)
        assert plugin_auto(SHAPE_32B, (32, 32), work, NVLINK).cadence == "vllm"
    small = ModelShape.from_config(SHAPES["qwen3-0.6b"])
    work = Workload(128, 2, 512, max_num_seqs=128)
    merge = pipeline(small, (14, 14), work, "merge", NVLINK)
    assert merge.req_per_s > 1.05 * pipeline(small, (14, 14), work, "vllm", NVLINK).req_per_s
    assert plugin_auto(small, (14, 14), work, NVLINK) == merge


def test_a_tp_shards_own_measured_table_is_read_where_one_ships(tmp_path, monkeypatch):
    import json

    from vllm_pp_cudagraph.commands.planning import pipeline_model
    from vllm_pp_cudagraph.shared import stage_costs
    from vllm_pp_cudagraph.commands.planning.pipeline_model import tp_shard

    shard = tp_shard(SHAPE_32B, 2)
    rows = [{"batch": 1, "layer_ms": 1.0, "embedding_ms": 0.0, "lm_head_ms": 0.0}]
    (tmp_path / f"{shard.signature()}.json").write_text(
        json.dumps({"signature": shard.signature(), "batches": rows}))
    monkeypatch.setattr(pipeline_model, "find_table",
                        lambda shape: stage_costs.find_table(shape, tmp_path))
    work = Workload(1, 1, 256, max_num_seqs=1)
    measured = tensor_parallel(SHAPE_32B, 2, work, NVLINK)
    # 64 layers of 1 ms each, plus what the table does not hold (KV reads, all-reduces).
    assert 0.064 < measured.tpot_s < 0.066
    monkeypatch.setattr(pipeline_model, "find_table", lambda shape: None)
    assert tensor_parallel(SHAPE_32B, 2, work, NVLINK).tpot_s < 0.03


@pytest.mark.parametrize("layout", ["pp", "tp"])
def test_served_prompts_ride_in_the_decode_steps_an_offline_batchs_do_not(layout, monkeypatch):
    """Under ``serve`` the requests that replace finished ones prefill inside the decode
    steps, so a longer prompt lengthens every step; an offline batch prefills first."""
    from vllm_pp_cudagraph.commands.planning import pipeline_model

    # TP's shard priced from the costs given here, not from its shipped table.
    monkeypatch.setattr(pipeline_model, "find_table", lambda shape: None)
    def predict(**work):
        workload = Workload(output_len=256, max_num_seqs=256, **work)
        if layout == "tp":
            return tensor_parallel(SHAPE_32B, 2, workload, NVLINK, linear_costs(0.01))
        return pipeline(SHAPE_32B, (32, 32), workload, "balance", NVLINK, linear_costs(0.01))

    short, long = (predict(concurrency=256, input_len=n) for n in (1, 1024))
    # 256 requests end every 256 rounds: 1,024 prompt tokens a round beside 256 decodes.
    assert long.tpot_s > 3 * short.tpot_s
    offline_short, offline_long = (predict(concurrency=256, input_len=n, prompts=256)
                                   for n in (1, 1024))
    # Only the longer context's KV reads.
    assert offline_long.tpot_s < 1.2 * offline_short.tpot_s


def _served(shape, concurrency, input_len=64, prompts=None, api_servers=1):
    work = Workload(concurrency, input_len, 256, max_num_seqs=1024, prompts=prompts,
                    api_servers=api_servers)
    return pipeline(shape, (32, 32) if shape is SHAPE_32B else (14, 14), work, "balance",
                    NVLINK)


def test_a_served_requests_ttft_is_its_wait_for_the_prompts_ahead_where_gpus_pace_it():
    """TTFT p50 grows with the prompts waiting to prefill; an offline batch has none."""
    def ttft(*args, **kwargs):
        return _served(*args, **kwargs).ttft_s

    assert ttft(SHAPE_32B, 1024) == pytest.approx(4 * ttft(SHAPE_32B, 256), rel=0.01)
    assert ttft(SHAPE_32B, 256, input_len=128) == pytest.approx(2 * ttft(SHAPE_32B, 256),
                                                                rel=0.05)
    assert ttft(SHAPE_32B, 1024, prompts=1024) is None


def test_a_small_models_served_requests_wait_to_be_taken_in_not_for_their_prefills():
    """Where the prompts prefill in less time than a closed loop's wave of new requests
    takes to be taken in (the 0.6B shape), TTFT p50 is that intake's share (measured
    0.58-0.97 s at 1,024 requests with four API servers), the same for longer prompts,
    and each request's time in the server holds it."""
    small = ModelShape.from_config(SHAPES["qwen3-0.6b"])
    at_1024 = _served(small, 1024, api_servers=4)
    assert at_1024.ttft_s == pytest.approx(TTFT_P50_SHARE * 1024 * SERVE_INTAKE_S[4])
    assert 0.6 < at_1024.ttft_s < 1.0
    assert _served(small, 256, api_servers=4).ttft_s == pytest.approx(at_1024.ttft_s / 4)
    assert _served(small, 1024, input_len=128, api_servers=4).ttft_s == pytest.approx(
        at_1024.ttft_s)
    assert at_1024.req_per_s == pytest.approx(
        1024 / (256 * at_1024.tpot_s + 1024 * SERVE_INTAKE_S[4]))
    # The 32B shape's prefills take longer than its intake: they set its TTFT.
    assert _served(SHAPE_32B, 1024, api_servers=4).ttft_s > (
        TTFT_P50_SHARE * 1024 * SERVE_INTAKE_S[4])


def test_one_api_server_takes_requests_in_slower_than_four():
    """With one API server (vLLM's default) a wave of new requests waits about three times
    as long to be taken in as with four: the 32B shape served at c256 on four H200s
    measured TTFT p50 0.51-1.16 s (benchmarks/results/2026-11-28-vllm033-4xh200-serve-quad-
    32b-c256-c1024), where its prefills alone would give 0.3 s."""
    assert intake_s(1) == pytest.approx(SERVE_INTAKE_S[1])
    assert intake_s(4) == pytest.approx(SERVE_INTAKE_S[4])
    assert intake_s(1) > intake_s(2) > intake_s(4) > intake_s(8) > 0
    tp2pp2 = Workload(256, 64, 256, max_num_seqs=1024)
    one = pipeline(SHAPE_32B, (32, 32), tp2pp2, "balance", NVLINK, tp=2)
    four = pipeline(SHAPE_32B, (32, 32), replace(tp2pp2, api_servers=4), "balance", NVLINK,
                    tp=2)
    assert 0.51 <= one.ttft_s <= 1.16
    assert four.ttft_s < 0.5 * one.ttft_s
    assert four.req_per_s > one.req_per_s


@pytest.mark.parametrize(("cadence", "measured_ms"), [("merge", (3.7, 4.0)), ("stock", (6.3, 7.4))])
def test_a_served_small_models_step_is_the_engines_serving_host_time(cadence, measured_ms):
    """Under ``vllm serve`` the engine core also takes requests and streams outputs each
    step, so where the host paces a small model the served step is dearer than the same
    step offline; priced so, the 0.6B cell at concurrency 64 (PP=2, both runners, four API
    servers: benchmarks/results/2026-11-28-vllm033-4xh200-soak-32b-vllm-cadence-0.6b-c64)
    comes out within its measured TPOT's spread."""
    shape = ModelShape.from_config(SHAPES["qwen3-0.6b"])

    def predict(prompts=None):
        work = Workload(64, 64, 256, max_num_seqs=1024, prompts=prompts, api_servers=4)
        return pipeline(shape, (14, 14), work, cadence, NVLINK)

    served, offline = predict(), predict(prompts=64)
    assert served.host_paced and offline.host_paced
    assert served.tpot_s > 1.4 * offline.tpot_s
    low, high = measured_ms
    assert 0.95 * low <= served.tpot_s * 1e3 <= 1.05 * high


def _h200_table(shape, batches):
    """A table of ``shape`` as if measured on an H200: 1 ms per layer at every batch."""
    rows = [{"batch": b, "layer_ms": 1.0, "embedding_ms": 0.01, "lm_head_ms": 0.5}
            for b in batches]
    return {"signature": shape.signature(), "batches": rows,
            "measured": {"device": "NVIDIA H200"}}


def test_an_h200_table_priced_for_an_h100_scales_memory_bound_parts_by_bandwidth():
    """At one token a step a 32B layer reads its weights: on an H100 (3.35 TB/s against the
    H200's 4.8) it costs up to 1.43x, less only by the fixed launch costs."""
    from pathlib import Path

    from vllm_pp_cudagraph.commands.planning.gpus import GPUS, rates
    from vllm_pp_cudagraph.shared.stage_costs import table_costs

    costs = table_costs(SHAPE_32B, Path("t.json"), _h200_table(SHAPE_32B, [1]), 1,
                        rates(GPUS["h100"]))
    assert 1.3 < costs.layer_s / 1e-3 <= 4.8 / 3.35 + 1e-9
    assert "measured on H200, converted to H100 SXM" in costs.source


def test_an_h200_table_priced_for_an_h100_keeps_compute_bound_parts():
    """At 8,192 tokens a step a 32B layer computes, and both GPUs have 989 TFLOPS: scaling
    it by bandwidth would make it 1.43x; it stays what the H200 measured."""
    from pathlib import Path

    from vllm_pp_cudagraph.commands.planning.gpus import GPUS, rates
    from vllm_pp_cudagraph.shared.stage_costs import table_costs

    costs = table_costs(SHAPE_32B, Path("t.json"), _h200_table(SHAPE_32B, [8192]), 8192,
                        rates(GPUS["h100"]))
    assert costs.layer_s == pytest.approx(1e-3, rel=0.02)
    same_gpu = table_costs(SHAPE_32B, Path("t.json"), _h200_table(SHAPE_32B, [8192]), 8192,
                           rates(GPUS["h200"]))
    assert same_gpu.layer_s == 1e-3 and "(measured)" in same_gpu.source


def test_tp_on_nvlink_is_priced_by_vllms_peer_to_peer_all_reduce_not_by_nccls_ring():
    """vLLM runs a TP=2 all-reduce over NVLink as one peer-to-peer shot (each GPU reads the
    other's input), not on NCCL: NCCL's measured ring bandwidth does not price it, a copy at
    the link's measured bandwidth bounds it, and NCCL prices it off NVLink."""
    slow_nccl = replace(NVLINK, all_reduce_bytes_per_s=NVLINK.all_reduce_bytes_per_s / 100)
    work = Workload(256, 64, 256, max_num_seqs=256)
    assert (tensor_parallel(SHAPE_32B, 2, work, slow_nccl).tpot_s
            == tensor_parallel(SHAPE_32B, 2, work, NVLINK).tpot_s)
    message = 2 << 20  # 2 MiB: 205 requests' hidden states of the 32B shape
    assert NVLINK.tp_all_reduce_s(message, 2) <= 10e-6 + message / 367e9
    assert NVLINK.tp_all_reduce_s(message, 2) < NVLINK.all_reduce_s(message, 2)
    host = LINKS["host"]
    assert host.tp_all_reduce_s(message, 2) == host.all_reduce_s(message, 2)
    # Past the largest message vLLM's own all-reduce takes, NCCL's ring again.
    assert NVLINK.tp_all_reduce_s(128 << 20, 2) == NVLINK.all_reduce_s(128 << 20, 2)
