"""The stage-cost tool: which layers a stage holds, how a profiled run splits into passes,
and arguments it refuses before starting an engine."""

from __future__ import annotations

import pytest
from _refusal import assert_refused

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.bench.trace_analysis import Step

from benchmarks.tools.stage_cost import decode_segments, main, stage_config


def step(context: int, generation: int, period: float = 1.0) -> Step:
    return Step(context_reqs=context, generation_reqs=generation, start_ms=0.0, forward_ms=0.5,
                period_ms=period, kernel_ms=0.8, nccl_ms=0.0, kernel_launches=0,
                graph_launches=1, syncs=0, sync_ms=0.0)


@pytest.mark.parametrize("shape, pp, layers", [("qwen3-32b", 2, 32), ("llama-3.1-70b", 2, 40),
                                               ("qwen3-0.6b-27l", 2, 14), ("qwen3-32b", 4, 16)])
def test_a_stage_holds_its_share_of_the_layers_and_nothing_else_changes(shape, pp, layers):
    config = stage_config(shape, pp)
    assert config["num_hidden_layers"] == layers
    assert {k: v for k, v in config.items() if k != "num_hidden_layers"} == {
        k: v for k, v in SHAPES[shape].items() if k != "num_hidden_layers"}
    assert SHAPES[shape]["num_hidden_layers"] != layers  # the built-in shape is left alone


def test_each_pass_is_the_decode_run_after_its_prefill():
    passes = [
        # chunked prefill, mixed with the first decodes, then decode alone; an empty step
        [step(4, 0), step(2, 2), step(0, 4, 2.0), step(0, 4, 2.0), step(0, 0)],
        [step(1, 0), step(0, 1, 1.0), step(0, 1, 1.0)],
        [step(8, 0), step(0, 8, 3.0)],
    ]
    segments = decode_segments([s for one in passes for s in one])
    assert [[s.generation_reqs for s in seg] for seg in segments] == [[4, 4], [1, 1], [8]]
    # decode steps before any prefill belong to no pass
    assert decode_segments([step(0, 3), *passes[2]]) == [[passes[2][1]]]


@pytest.mark.parametrize("argv, named", [
    (["--shapes", "qwen3-65b"], "qwen3-65b"),
    (["--batches", "0,16"], "--batches"),
    (["--layers", "0"], "--layers"),
    (["--model", "/nonexistent"], "no readable config.json"),
])
def test_bad_arguments_are_refused_before_anything_starts(tmp_path, capsys, argv, named):
    assert_refused(main, tmp_path / "out", capsys, argv, named)
