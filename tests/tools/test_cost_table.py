"""The cost-table tool's pure parts: the fit over layer counts, the table auto reads, and
arguments it refuses before starting an engine."""

from __future__ import annotations

import json

import pytest
from _refusal import assert_refused

from benchmarks.tools.cost_table import cost_table, fit_rows, main
from benchmarks.tools.stage_cost import stage_config
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.shared.layer_partition import Memory, decide
from vllm_pp_cudagraph.shared.stage_costs import ModelShape, read_table
from vllm_pp_cudagraph.shared.settings import LayerPartition

CONFIG = SHAPES["qwen3-0.6b"]


def run(layers: int, per_layer: dict[int, float], fixed: dict[int, float],
        profiled: bool = True) -> dict:
    """A stage_cost.py result for a stage of ``layers`` layers with these costs (ms)."""
    key = "kernel_ms" if profiled else "step_ms"
    rows = [{"context": 64, "batch": b, "step_ms": 99.0, key: fixed[b] + layers * per_layer[b]}
            for b in per_layer]
    if not profiled:
        for row in rows:
            row["kernel_ms"] = None
    return {"shape": "qwen3-0.6b", "layers": layers, "rows": rows}


def test_the_fit_recovers_a_layers_cost_and_the_rest():
    per_layer, fixed = {1: 0.05, 256: 0.08}, {1: 0.12, 256: 0.4}
    rows = fit_rows([run(4, per_layer, fixed), run(12, per_layer, fixed)], CONFIG)
    assert [r["batch"] for r in rows] == [1, 256]
    for row in rows:
        b = row["batch"]
        assert row["layer_ms"] == pytest.approx(per_layer[b])
        assert row["embedding_ms"] + row["lm_head_ms"] == pytest.approx(fixed[b], abs=1e-4)
        assert 0 < row["embedding_ms"] < 0.01


def test_wall_time_stands_in_where_no_profile_was_taken():
    rows = fit_rows([run(4, {8: 0.1}, {8: 0.3}, profiled=False),
                     run(8, {8: 0.1}, {8: 0.3}, profiled=False)], CONFIG)
    assert rows[0]["layer_ms"] == pytest.approx(0.1)


def test_a_fit_needs_a_positive_slope():
    with pytest.raises(ValueError, match="too noisy"):
        fit_rows([run(4, {1: 0.1}, {1: 1.0}), run(12, {1: -0.01}, {1: 1.4})], CONFIG)


def test_the_table_it_writes_is_the_one_auto_reads(tmp_path):
    per_layer, fixed = {1: 0.04, 256: 0.05}, {1: 0.3, 256: 0.5}  # LM head: 10 layers
    table = cost_table(CONFIG, [run(4, per_layer, fixed), run(12, per_layer, fixed)],
                       {"device": "test"})
    assert table["signature"] == ModelShape.from_config(CONFIG).signature()
    path = tmp_path / f"{table['signature']}.json"
    path.write_text(json.dumps(table))
    read_table(path)
    decision = decide(LayerPartition.AUTO, CONFIG, 8, 256, None, tables=tmp_path,
                      memory=Memory(141 * 2**30, 0.9))  # an H200
    assert decision.costs.source.endswith("(measured)")
    assert decision.layers == (3, 4, 4, 4, 4, 4, 4, 1)


def test_a_stage_of_a_given_layer_count_or_model_directory(tmp_path):
    assert stage_config("qwen3-32b", 2, layers=4)["num_hidden_layers"] == 4
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 512}))
    config = stage_config("ignored", 4, model_dir=str(tmp_path))
    assert config["hidden_size"] == 512 and config["num_hidden_layers"] == 7
    with pytest.raises(ValueError, match="--layers 0"):
        stage_config("qwen3-32b", 2, layers=0)


@pytest.mark.parametrize("argv, named", [
    (["--shape", "qwen3-65b"], "qwen3-65b"),
    (["--shape", "qwen3-0.6b", "--layers", "4,4"], "two layer counts"),
    ([], "the following arguments are required: --shape"),
])
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, capsys, argv, named):
    assert_refused(main, tmp_path / "out", capsys, argv, named)


@pytest.mark.parametrize("shape", ["qwen3-32b", "llama-3.1-70b", "qwen3-30b-a3b"])
def test_a_tp_shards_config_is_filed_where_plan_looks_for_its_table(shape):
    """plan reads a TP rank's costs from the table of the shard's own signature: the
    config --tp measures must give exactly that shape (head size kept)."""
    from vllm_pp_cudagraph.commands.planning.pipeline_model import tp_shard, tp_shard_config

    full = ModelShape.from_config(SHAPES[shape])
    shard = ModelShape.from_config(tp_shard_config(dict(SHAPES[shape]), 2))
    assert shard == tp_shard(full, 2)
    assert shard.head_dim == full.head_dim and shard.num_heads == full.num_heads // 2


def test_tp_measures_the_shard_as_a_model_of_its_own(tmp_path, monkeypatch):
    from benchmarks.tools import cost_table as tool

    measured = []
    monkeypatch.setattr(tool, "_measure", lambda args, layers, source: measured.append(
        source) or run(layers, {1: 0.04}, {1: 0.3}))
    main(["--shape", "qwen3-0.6b", "--tp", "2", "--out", str(tmp_path)])
    shard_dir = tmp_path / "tp2-shard"
    assert measured == [["--model", str(shard_dir)]] * 2
    config = json.loads((shard_dir / "config.json").read_text())
    assert config["num_attention_heads"] == 8 and config["head_dim"] == 128
    (table,) = [p for p in tmp_path.glob("*.json")]
    assert "-a8kv4d128-" in table.name
