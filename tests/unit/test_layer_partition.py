"""VLLM_PP_CUDAGRAPH_LAYER_PARTITION: the split auto picks, and how vLLM gets it."""

from __future__ import annotations

import json
import logging
import os

import pytest
from _scheduler import make_scheduler
from conftest import run_python
from vllm import envs
from vllm.distributed.utils import get_pp_indices
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, write_model_dir
from vllm_pp_cudagraph.shared.vllm_surface import vllm_split
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, plan_engine
from vllm_pp_cudagraph.shared import layer_partition
from vllm_pp_cudagraph.shared.layer_partition import (
    GIB,
    KV_TOLERANCE,
    SETTING,
    VLLM_ENV,
    LayerPartitionError,
    Memory,
    decide,
)
from vllm_pp_cudagraph.shared.stage_costs import (
    TABLES,
    CostTableError,
    ModelShape,
    modelled_costs,
    read_table,
    stage_costs,
)
from vllm_pp_cudagraph.shared.settings import (
    LayerPartition,
    PPCudaGraphSettings,
    SettingsError,
)
from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner

AUTO = LayerPartition.AUTO
BATCH = 256
TOKENS = 8192  # max_num_batched_tokens
#: An H200 (141 GiB) at gpu_memory_utilization 0.9.
H200 = Memory(141 * GIB, 0.9)
#: The engine's KV cache fixed at 20 GiB a stage (kv_cache_memory_bytes).
FIXED = Memory(kv_cache_bytes=20 * GIB)

#: What auto picks for the bench shapes at max_num_seqs=256 on an H200, from the
#: shipped cost tables (0.6B, 32B, 30B-A3B) or the bytes/FLOPs model. At PP=2 and PP=4
#: every bench shape splits evenly, and a stage with one layer more stores 1/n more
#: KV bytes per token: no move keeps the KV cache within KV_TOLERANCE. Where vLLM's
#: split is uneven (PP=3, PP=8), the stages with fewer layers have room to take one.
PICKS = {
    ("qwen3-0.6b", 2): (14, 14),
    ("qwen3-0.6b", 3): (10, 10, 8),
    ("qwen3-0.6b", 4): (7, 7, 7, 7),
    ("qwen3-0.6b", 8): (3, 4, 4, 4, 4, 4, 4, 1),
    ("qwen3-4b", 2): (18, 18),
    ("qwen3-4b", 4): (9, 9, 9, 9),
    ("qwen3-32b", 2): (32, 32),
    ("qwen3-32b", 4): (16, 16, 16, 16),
    ("llama-3.1-70b", 2): (40, 40),
    ("llama-3.1-70b", 4): (20, 20, 20, 20),
    ("qwen3-30b-a3b", 2): (24, 24),
    ("qwen3-30b-a3b", 4): (12, 12, 12, 12),
}
#: Where the KV cache is fixed, a split may only even out vLLM's most loaded stages.
FIXED_PICKS = {
    ("qwen3-0.6b", 3): (10, 10, 8),
    ("qwen3-32b", 3): (21, 22, 21),  # vLLM's: its LM head costs less than a layer
    ("qwen3-0.6b", 4): (7, 7, 7, 7),
    ("qwen3-30b-a3b", 4): (12, 12, 12, 12),
}


def auto(config, pp, batch=BATCH, memory=H200, **kwargs):
    return decide(AUTO, config, pp, batch, None, memory=memory, max_num_batched_tokens=TOKENS,
                  **kwargs)


@pytest.fixture
def partition_env(monkeypatch):
    """No VLLM_PP_LAYER_PARTITION, vLLM's variable cache off, nothing set by the plugin;
    all of it restored afterwards."""
    monkeypatch.delenv(VLLM_ENV, raising=False)
    monkeypatch.delenv(SETTING, raising=False)
    yield monkeypatch
    os.environ.pop(VLLM_ENV, None)  # set by the code under test; monkeypatch restores a prior one
    envs.disable_envs_cache()


def engine_config(tmp_path, shape="qwen3-0.6b", pp=3, max_num_seqs=BATCH):
    model = write_model_dir(tmp_path / shape, shape)
    config = make_scheduler(str(model), pp=pp, max_num_seqs=max_num_seqs).vllm_config
    config.cache_config.gpu_memory_utilization = H200.utilization
    return config


@pytest.fixture
def on_h200(monkeypatch):
    """The worker reads an H200's total memory."""
    monkeypatch.setattr(layer_partition, "gpu_memory_bytes", lambda: H200.gpu_bytes)


def test_vllms_split_is_the_one_vllm_computes(partition_env):
    for pp in (1, 2, 3, 4, 5, 8):
        for num_layers in range(pp, 130):
            ranges = [get_pp_indices(num_layers, rank, pp) for rank in range(pp)]
            assert vllm_split(num_layers, pp) == tuple(end - start for start, end in ranges)


@pytest.mark.parametrize("shape, pp", PICKS)
def test_auto_picks_for_the_bench_shapes(shape, pp):
    decision = auto(SHAPES[shape], pp)
    num_layers = SHAPES[shape]["num_hidden_layers"]
    assert decision.layers == PICKS[shape, pp]
    assert sum(decision.layers) == num_layers and min(decision.layers) >= 1
    stock = vllm_split(num_layers, pp)
    assert decision.vllm_layers == stock
    assert decision.source == ("vllm" if decision.layers == stock else "auto")
    assert decision.slowest_ms(decision.layers) <= decision.slowest_ms(stock)


@pytest.mark.parametrize("shape, pp", FIXED_PICKS)
def test_auto_picks_with_the_kv_cache_fixed(shape, pp):
    assert auto(SHAPES[shape], pp, memory=FIXED).layers == FIXED_PICKS[shape, pp]


@pytest.mark.parametrize("memory", [H200, FIXED, Memory(24 * GIB, 0.9)])
@pytest.mark.parametrize("batch", [BATCH, 4096])
@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_pick_lowers_the_kv_capacity_below_the_tolerance(shape, pp, batch, memory):
    decision = auto(SHAPES[shape], pp, batch, memory)
    kv = decision.kv
    assert kv.tokens(decision.layers) >= (1 - KV_TOLERANCE) * kv.tokens(decision.vllm_layers)
    assert min(decision.layers) >= 1


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_fixed_kv_cache_lets_no_stage_grow_beyond_vllms_most_loaded(shape, pp):
    decision = auto(SHAPES[shape], pp, memory=FIXED)
    assert max(decision.layers) <= max(decision.vllm_layers)
    assert decision.kv.tokens(decision.layers) == decision.kv.tokens(decision.vllm_layers)


def fastest_pp2_split(decision):
    """The PP=2 split with the fastest slowest stage under ``decision``'s costs, whatever
    it does to the KV cache."""
    num_layers = sum(decision.layers)
    return min(((n, num_layers - n) for n in range(1, num_layers)), key=decision.slowest_ms)


def test_the_kv_rule_is_what_keeps_the_small_model_at_vllms_split():
    """Without it, 0.6B at PP=2 would move a layer off the last stage (its shipped cost
    table: 15,13): its slowest stage is faster, but the stage of 15 layers would hold
    about 7% fewer tokens of KV cache."""
    kept = auto(SHAPES["qwen3-0.6b"], 2)
    unbounded = fastest_pp2_split(kept)
    assert unbounded == (15, 13)
    assert kept.layers == (14, 14) and kept.source == "vllm"
    assert kept.kv.tokens(unbounded) < 0.94 * kept.kv.tokens((14, 14))
    assert "no other split that keeps the KV cache within 1%" in kept.why


MOE_TABLE = "qwen3_moe-h2048-l48-a32kv4d128-i6144-e128x8i768s0-v151936-b2.json"


@pytest.mark.parametrize("pp, batch, stage_ms", [
    (2, 256, [12.49, 12.89]), (4, 256, [6.25, 6.24, 6.24, 6.65]), (2, 1, [1.93, 2.19])])
def test_the_moe_shapes_shipped_table_keeps_vllms_split(pp, batch, stage_ms):
    """Its measured MoE layer (0.52 ms at batch 256) costs more than the LM head and
    sampler (0.41 ms): the last stage is a few percent slower, not a layer."""
    decision = auto(SHAPES["qwen3-30b-a3b"], pp, batch)
    assert decision.costs.source == f"the cost table {MOE_TABLE} (measured)"
    assert decision.layers == decision.vllm_layers and decision.source == "vllm"
    assert [round(ms, 2) for ms in decision.stage_ms(decision.layers)] == stage_ms


def test_at_one_request_the_kv_rule_keeps_the_moe_shape_even():
    """At one request its LM head weighs 3.4 layers: 26,22 is faster but holds 10% fewer
    tokens."""
    kept = auto(SHAPES["qwen3-30b-a3b"], 2, 1)
    unbounded = fastest_pp2_split(kept)
    assert unbounded == (26, 22)
    assert kept.slowest_ms(unbounded) < 0.96 * kept.slowest_ms((24, 24))
    assert kept.layers == (24, 24)
    assert kept.kv.tokens(unbounded) < 0.91 * kept.kv.tokens((24, 24))


def test_the_last_stage_gets_fewer_layers_where_the_lm_head_is_heavy_and_room_allows():
    config = SHAPES["qwen3-0.6b"]
    costs = modelled_costs(ModelShape.from_config(config), BATCH)
    assert costs.head_s > 4 * costs.layer_s  # 152k words x 1024 against a 16M-weight layer
    decision = auto(config, 3)  # vLLM's 9,10,9: the middle stage's 10 layers bound the KV
    assert decision.source == "auto" and decision.layers == (10, 10, 8)
    assert decision.slowest_ms(decision.layers) < 0.95 * decision.slowest_ms(decision.vllm_layers)


def test_the_last_stages_logits_peak_can_leave_the_others_room_for_a_layer(monkeypatch):
    """No bench shape at PP=2 or PP=4 on an H200 moves. On a 24 GiB GPU at
    max_num_seqs=4096, the sampler's profiling logits (4096 x 152k fp32, 2.3 GiB)
    leave the last stage the least room, so the other stages may take a layer more
    and the cache still holds as many tokens within the tolerance."""
    config, small = SHAPES["qwen3-0.6b"], Memory(24 * GIB, 0.9)
    decision = auto(config, 4, 4096, small)
    assert decision.kv.logits_bytes == 4096 * 151936 * 4
    assert decision.layers == (7, 8, 8, 5)
    monkeypatch.setattr(layer_partition, "LOGIT_BYTES", 0)
    assert auto(config, 4, 4096, small).layers == (7, 7, 7, 7)


def test_the_sampler_profiles_one_logit_per_request():
    """MRV2's profile_run samples one token per dummy request: min(max_num_batched_tokens,
    max_num_seqs) of them."""
    config = SHAPES["qwen3-0.6b"]
    assert auto(config, 4).kv.logits_bytes == BATCH * 151936 * 4
    few = decide(AUTO, config, 4, BATCH, None, memory=H200, max_num_batched_tokens=100)
    assert few.kv.logits_bytes == 100 * 151936 * 4


def test_the_decision_says_the_kv_room_and_capacity_under_both_splits():
    lines = auto(SHAPES["qwen3-0.6b"], 3).describe()
    assert lines[0] == "auto picks 10,10,8 for PP=3 at batch 256 (vLLM's split: 9,10,9)"
    assert any(line.startswith("stage 2: layers 20-27 (8), predicted") and "KV room" in line
               for line in lines)
    assert ("KV cache 3311330 tokens predicted against 3318927 under vLLM's split "
            "(141.00 GiB of GPU memory x gpu_memory_utilization 0.9)") in lines


def test_without_the_gpus_memory_or_kv_heads_auto_keeps_vllms_split():
    config = SHAPES["qwen3-0.6b"]
    unknown = decide(AUTO, config, 3, BATCH, None)
    assert unknown.layers == (9, 10, 9) and unknown.source == "vllm"
    assert "the GPU's memory is not known" in unknown.why
    no_heads = auto({k: v for k, v in config.items() if k != "num_key_value_heads"}, 3)
    assert no_heads.layers == (9, 10, 9) and "no num_key_value_heads" in no_heads.why


def test_the_model_gives_the_measured_one_request_stage_steps_within_ten_percent():
    """GPU time per decode step of one request, one H200, vLLM 0.33 (the stage costs in
    docs/performance.md): a PP=2 stage of each shape with the LM head and sampler."""
    measured_ms = {"qwen3-32b": 9.055, "llama-3.1-70b": 18.194, "qwen3-30b-a3b": 1.842,
                   "qwen3-0.6b": 0.709}
    for shape, ms in measured_ms.items():
        costs = modelled_costs(ModelShape.from_config(SHAPES[shape]), 1)
        layers = SHAPES[shape]["num_hidden_layers"] // 2
        predicted = 1e3 * (costs.stage_s(1, 2, layers) + costs.embedding_s)
        assert abs(predicted / ms - 1) < 0.10, (shape, predicted, ms)


def test_moe_layers_read_the_experts_their_tokens_pick():
    shape = ModelShape.from_config(SHAPES["qwen3-30b-a3b"])
    expert = 3 * 2048 * 768 * 2
    assert shape.layer_bytes_read(2) - shape.layer_bytes_read(1) == 8 * expert
    assert shape.layer_bytes_read(16) == shape.layer_bytes_read(BATCH)  # all 128 experts
    assert shape.layer_bytes_read(BATCH) == shape.layer_bytes


SCRIPT = """
import json
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.shared.layer_partition import decide
from vllm_pp_cudagraph.shared.settings import LayerPartition
from vllm_pp_cudagraph.shared.layer_partition import Memory
memory = Memory(141 * 2**30, 0.9)
print(json.dumps({f"{s} {pp}": decide(LayerPartition.AUTO, SHAPES[s], pp, 256, None,
                                      memory=memory, max_num_batched_tokens=8192).layers
                  for s in SHAPES for pp in (2, 3, 4, 8)}))
"""


def test_every_process_computes_the_same_partition():
    here = {f"{s} {pp}": list(auto(SHAPES[s], pp).layers)
            for s in SHAPES for pp in (2, 3, 4, 8)}
    assert here == {key: list(auto(SHAPES[key.split()[0]], int(key.split()[1])).layers)
                    for key in here}
    for seed in ("1", "2"):
        there, _ = run_python(SCRIPT, {"PYTHONHASHSEED": seed})
        assert there == here


def test_a_hand_set_partition_wins_over_auto():
    decision = decide(AUTO, SHAPES["qwen3-0.6b"], 2, BATCH, hand_set="20,8")
    assert decision.source == "hand-set"
    assert decision.layers == (20, 8) and decision.env_value is None
    assert f"{VLLM_ENV}=20,8, which wins over {SETTING}=auto" in decision.why


def test_more_stages_than_layers_is_refused_naming_the_setting():
    config = {**SHAPES["qwen3-0.6b"], "num_hidden_layers": 3}
    with pytest.raises(LayerPartitionError, match=f"{SETTING}=auto cannot give each of 4 "
                       "pipeline stages a layer: the model has 3"):
        decide(AUTO, config, 4, BATCH, None)
    assert decide(AUTO, config, 3, BATCH, None).layers == (1, 1, 1)
    assert decide(LayerPartition.VLLM, config, 4, BATCH, None).env_value is None


@pytest.mark.parametrize("raw", ["balanced", "1", "on"])
def test_a_bad_setting_is_refused_naming_it_and_its_choices(raw):
    with pytest.raises(SettingsError) as err:
        PPCudaGraphSettings.from_env({SETTING: raw})
    assert f"{SETTING}={raw!r}" in str(err.value)
    assert "'vllm' or 'auto'" in str(err.value)


@pytest.mark.parametrize("raw", ["auto", " AUTO ", "vllm", "Vllm"])
def test_the_setting_parses(raw):
    value = PPCudaGraphSettings.from_env({SETTING: raw}).layer_partition
    assert value.value == raw.strip().lower()
    assert PPCudaGraphSettings.from_env({}).layer_partition is LayerPartition.VLLM


@pytest.mark.parametrize("change, reason", [
    ({"quantization_config": {"quant_method": "fp8"}}, "quantized"),
    ({"layers_block_type": ["attention", "mamba"]}, "several kinds"),
    ({"mlp_only_layers": [0]}, "dense and others MoE"),
])
def test_models_the_cost_model_does_not_know_keep_vllms_split(change, reason):
    decision = decide(AUTO, {**SHAPES["qwen3-30b-a3b"], **change}, 4, BATCH, None)
    assert decision.source == "vllm" and decision.env_value is None
    assert decision.layers == (12, 12, 12, 12)
    assert "auto keeps vLLM's split 12,12,12,12" in decision.why and reason in decision.why


def write_table(directory, config, layer_ms, head_ms, batches=(1, 512)):
    shape = ModelShape.from_config(config)
    rows = [{"batch": b, "layer_ms": layer_ms, "embedding_ms": 0.0, "lm_head_ms": head_ms}
            for b in batches]
    (directory / "table.json").write_text(json.dumps({"signature": shape.signature(),
                                                      "batches": rows}))


def test_a_measured_table_replaces_the_model_for_its_shape(tmp_path):
    config = SHAPES["qwen3-0.6b"]
    write_table(tmp_path, {**config, "hidden_size": 2048}, 0.1, 1.0)  # another shape
    other = auto(config, 8, tables=tmp_path)
    assert other.costs.source == "the bytes/FLOPs model"
    write_table(tmp_path, config, 0.1, 0.25)  # the LM head is worth 2.5 layers
    decision = auto(config, 8, tables=tmp_path)
    assert decision.costs.source == "the cost table table.json (measured)"
    assert decision.layers == (4, 4, 3, 4, 4, 4, 4, 1)
    assert "costs at batch 256 from the cost table table.json (measured)" in decision.describe()


def test_every_stage_keeps_a_layer_however_heavy_the_lm_head(tmp_path):
    write_table(tmp_path, SHAPES["qwen3-0.6b"], 0.1, 5.0)  # the LM head: 50 layers
    decision = auto(SHAPES["qwen3-0.6b"], 8, tables=tmp_path)
    assert decision.layers[-1] == 1 and sum(decision.layers) == 28


def test_a_table_between_batch_sizes_is_interpolated(tmp_path):
    config = SHAPES["qwen3-0.6b"]
    shape = ModelShape.from_config(config)
    rows = [{"batch": 1, "layer_ms": 0.1, "embedding_ms": 0, "lm_head_ms": 0.2},
            {"batch": 101, "layer_ms": 0.2, "embedding_ms": 0, "lm_head_ms": 1.2}]
    (tmp_path / "t.json").write_text(json.dumps({"signature": shape.signature(),
                                                 "batches": rows}))

    costs = stage_costs(shape, 51, tmp_path)
    assert costs.layer_s == pytest.approx(0.15e-3) and costs.head_s == pytest.approx(0.7e-3)
    assert stage_costs(shape, 1, tmp_path).layer_s == pytest.approx(0.1e-3)


def test_a_table_grows_past_its_largest_batch_as_the_model_does(tmp_path):
    """Past the largest measured batch the step computes more than it reads: its cost grows
    with the batch, not held at the last row (which priced 1,024 requests as 256)."""
    shape = ModelShape.from_config(SHAPES["qwen3-32b"])
    rows = [{"batch": 256, "layer_ms": 0.5, "embedding_ms": 0, "lm_head_ms": 0.4}]
    (tmp_path / "t.json").write_text(json.dumps({"signature": shape.signature(),
                                                 "batches": rows}))
    assert stage_costs(shape, 256, tmp_path).layer_s == pytest.approx(0.5e-3)
    # Compute-bound at 256 already: four times the requests, about four times the time.
    assert 3.2 * 0.5e-3 < stage_costs(shape, 1024, tmp_path).layer_s < 4 * 0.5e-3


def test_an_unreadable_table_is_refused_naming_its_file(tmp_path):
    (tmp_path / "broken.json").write_text(json.dumps({"signature": "x", "batches": [{}]}))
    with pytest.raises(CostTableError, match="broken.json"):
        auto(SHAPES["qwen3-0.6b"], 2, tables=tmp_path)


def test_every_shipped_table_is_readable_and_named_for_its_shape():
    """A table whose file name drifted from its signature would never be found."""
    paths = sorted(TABLES.glob("*.json"))
    assert len(paths) >= 2, f"the package ships no cost tables ({TABLES})"
    for path in paths:
        assert read_table(path)["signature"] == path.stem


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "qwen3-30b-a3b"])
def test_the_measured_shapes_read_their_shipped_table(shape):
    costs = stage_costs(ModelShape.from_config(SHAPES[shape]), batch=256)
    assert "(measured)" in costs.source


# How the choice reaches vLLM, on a real VllmConfig and vLLM's own get_pp_indices.


def vllms_ranges(num_layers, pp):
    return [get_pp_indices(num_layers, rank, pp) for rank in range(pp)]


def worker_plan(config):
    """The plan a worker makes for ``config`` (from its settings and its GPU's memory)."""
    return plan_engine(PPCudaGraphSettings.current(), EngineFacts.of(config),
                       layer_partition.gpu_memory_bytes())


def worker_applies(config):
    """What a worker's runner does before its model is built: its plan's split, handed to
    vLLM; returns that decision."""
    decision = worker_plan(config).partition
    layer_partition.apply(decision)
    return decision


def test_with_the_default_nothing_changes(partition_env, tmp_path):
    config = engine_config(tmp_path)
    decision = worker_applies(config)
    assert decision.source == "vllm" and not decision.noteworthy
    assert VLLM_ENV not in os.environ
    assert vllms_ranges(28, 3) == [(0, 9), (9, 19), (19, 28)]


@pytest.mark.parametrize("cached", [False, True])
def test_auto_hands_vllm_its_split_even_with_vllms_variables_cached(partition_env, on_h200,
                                                                    tmp_path, cached):
    partition_env.setenv(SETTING, "auto")
    config = engine_config(tmp_path)
    if cached:  # as in a worker forked from a process that already served
        envs.enable_envs_cache()
        assert envs.VLLM_PP_LAYER_PARTITION is None
    decision = worker_applies(config)
    assert decision.env_value == "10,10,8"
    assert vllms_ranges(28, 3) == [(0, 10), (10, 20), (20, 28)]
    assert config.model_config.get_layers_start_end_indices(config.parallel_config) == (0, 10)


def test_a_hand_set_partition_is_left_to_vllm(partition_env, tmp_path):
    partition_env.setenv(SETTING, "auto")
    partition_env.setenv(VLLM_ENV, "20,8")
    assert worker_applies(engine_config(tmp_path, pp=2)).source == "hand-set"
    assert os.environ[VLLM_ENV] == "20,8"
    assert vllms_ranges(28, 2) == [(0, 20), (20, 28)]


def test_a_later_engine_in_the_process_drops_the_split_it_no_longer_chooses(partition_env,
                                                                           on_h200, tmp_path):
    partition_env.setenv(SETTING, "auto")
    worker_applies(engine_config(tmp_path))
    assert os.environ[VLLM_ENV] == "10,10,8"
    # Its own value is not a hand-set one: the next engine decides again.
    again = worker_applies(engine_config(tmp_path, "qwen3-30b-a3b"))
    assert again.source == "vllm" and VLLM_ENV not in os.environ
    assert vllms_ranges(48, 3) == [(0, 16), (16, 32), (32, 48)]


def test_the_worker_decides_from_this_gpus_memory_or_the_fixed_kv_cache(partition_env,
                                                                       tmp_path, monkeypatch):
    partition_env.setenv(SETTING, "auto")
    monkeypatch.setattr(layer_partition, "gpu_memory_bytes", lambda: None)  # no GPU here
    config = engine_config(tmp_path)
    unknown = worker_applies(config)
    assert unknown.source == "vllm" and "the GPU's memory is not known" in unknown.why
    config.cache_config.kv_cache_memory_bytes = FIXED.kv_cache_bytes
    fixed = worker_applies(config)
    assert fixed.layers == (10, 10, 8) and fixed.kv.memory.kv_cache_bytes == FIXED.kv_cache_bytes
    assert "kv_cache_memory_bytes=21474836480 (20.00 GiB) on every stage" in fixed.describe()[-2]


def test_more_stages_than_layers_stops_the_worker_before_its_model_is_built(partition_env,
                                                                          tmp_path):
    partition_env.setenv(SETTING, "auto")
    config = engine_config(tmp_path)
    config.parallel_config.pipeline_parallel_size = 29
    with pytest.raises(LayerPartitionError, match=SETTING):
        worker_applies(config)
    assert VLLM_ENV not in os.environ


def test_vllm_reading_another_value_is_an_error(partition_env, monkeypatch):
    monkeypatch.setitem(envs.environment_variables, VLLM_ENV, lambda: "1,1")
    with pytest.raises(RuntimeError, match="vLLM reads VLLM_PP_LAYER_PARTITION='1,1'"):
        layer_partition.apply(layer_partition.Decision("auto", "test", layers=(15, 13)))


def test_the_runner_sets_the_split_before_vllm_builds_the_model(partition_env, on_h200,
                                                               tmp_path, monkeypatch,
                                                               pp_group):
    partition_env.setenv(SETTING, "auto")
    seen = []
    monkeypatch.setattr(GPUModelRunner, "load_model",
                        lambda self, *a, **k: seen.append(envs.VLLM_PP_LAYER_PARTITION))
    monkeypatch.setattr(PPCudaGraphModelRunner, "_check_stage_handoffs", lambda self: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "_start_stage_clock", lambda self: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "_register_sampling_warm_ups", lambda self: None)
    monkeypatch.setattr("vllm_pp_cudagraph.worker.model_runner.get_tp_group",
                        lambda: type("TP", (), {"rank_in_group": 0})())
    runner = PPCudaGraphModelRunner.__new__(PPCudaGraphModelRunner)
    runner._init_stage_state()
    config = engine_config(tmp_path)
    runner.__dict__.update(use_pp=True, pp_stage=0, vllm_config=config, plan=worker_plan(config))
    runner.load_model()
    assert seen == ["10,10,8"]


@pytest.mark.parametrize("pp, setting, hand, used", [
    (3, "auto", None, [10, 10, 8]),
    (2, "auto", None, [14, 14]),  # auto keeps vLLM's split, and says which
    (2, "vllm", "20,8", [20, 8]),
    (2, "vllm", None, None),  # the default: nothing to say
])
def test_stage_zero_logs_the_split_and_the_bench_reads_it_from_the_records(
        partition_env, on_h200, tmp_path, monkeypatch, caplog, pp, setting, hand, used,
        pp_group):
    from vllm_pp_cudagraph.commands.bench.engine_run import record_findings

    partition_env.setenv("VLLM_PP_CUDAGRAPH_METRICS_DIR", str(tmp_path / "records"))
    partition_env.setenv(SETTING, setting)
    if hand:
        partition_env.setenv(VLLM_ENV, hand)
    monkeypatch.setattr(GPUModelRunner, "load_model", lambda self, *a, **k: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "_check_stage_handoffs", lambda self: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "_start_stage_clock", lambda self: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "_register_sampling_warm_ups", lambda self: None)
    monkeypatch.setattr("vllm_pp_cudagraph.worker.model_runner.get_tp_group",
                        lambda: type("TP", (), {"rank_in_group": 0})())
    config = engine_config(tmp_path, pp=pp)
    for stage in range(pp):  # every stage decides; stage 0 alone logs
        runner = PPCudaGraphModelRunner.__new__(PPCudaGraphModelRunner)
        runner._init_stage_state()
        runner.__dict__.update(use_pp=True, pp_stage=stage, vllm_config=config,
                               plan=worker_plan(config))
        with caplog.at_level(logging.INFO, logger="vllm.pp_cudagraph"):
            runner.load_model()
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith(layer_partition.LOG_PREFIX)]
    assert len(lines) == (0 if used is None else 1), lines
    if used:
        assert lines[0].startswith(f"{layer_partition.LOG_PREFIX}{','.join(map(str, used))} over")
    assert record_findings(tmp_path / "records")["layer_partition_used"] == used


def test_the_split_the_plugin_sets_for_vllm_is_never_taken_for_a_hand_set_one(partition_env):
    """A worker sets VLLM_PP_LAYER_PARTITION for vLLM under ``auto``; a later engine in the
    same process still sees the split the process started with (none here), and the
    variable goes back to it."""
    from vllm_pp_cudagraph.shared.settings import hand_set_partition

    assert hand_set_partition() is None
    layer_partition.apply(layer_partition.Decision("auto", "auto picks", (10, 10, 8)))
    assert os.environ[VLLM_ENV] == "10,10,8" and hand_set_partition() is None
    layer_partition.apply(layer_partition.Decision("vllm", "vLLM's split"))
    assert VLLM_ENV not in os.environ
