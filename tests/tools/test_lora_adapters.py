"""The soak's LoRA adapters: vLLM reads them, serves them, and the load uses them."""

from __future__ import annotations

import argparse

import pytest
from _serve_parser import parse_serve_args

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.bench.serve_load import request_body

from benchmarks.tools.lora_adapters import TARGETS, lora_serve_args, write_lora_adapter
from benchmarks.tools.sampling_mix import scored
from benchmarks.tools.soak import soak_load


def test_vllm_loads_an_adapter_for_every_layer_and_projection(tmp_path, monkeypatch):
    import vllm.lora.lora_model as lora_model
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    # Pinned host memory needs a CUDA driver; this machine has none.
    monkeypatch.setattr(lora_model, "PIN_MEMORY", False)

    config = SHAPES["qwen3-0.6b"]
    path = write_lora_adapter(tmp_path / "lora0", config, rank=8, seed=1)
    helper = PEFTHelper.from_local_dir(str(path), config["max_position_embeddings"])
    assert (helper.r, helper.lora_alpha) == (8, 16)
    model = LoRAModel.from_local_checkpoint(str(path), set(TARGETS), helper, lora_model_id=1,
                                            device="cpu")
    assert len(model.loras) == config["num_hidden_layers"] * len(TARGETS)
    q = model.loras["model.layers.0.self_attn.q_proj"]
    assert tuple(q.lora_a.shape) == (8, config["hidden_size"])
    assert q.lora_b.abs().sum() > 0, "a zero lora_B would leave outputs unchanged"


def test_two_seeds_give_two_different_adapters(tmp_path):
    from safetensors.torch import load_file

    config = SHAPES["qwen3-0.6b"]
    a = load_file(write_lora_adapter(tmp_path / "a", config, seed=1) / "adapter_model.safetensors")
    b = load_file(write_lora_adapter(tmp_path / "b", config, seed=2) / "adapter_model.safetensors")
    key = "base_model.model.model.layers.3.self_attn.o_proj.lora_B.weight"
    assert a.keys() == b.keys() and not (a[key] == b[key]).all()


def test_vllm_serve_accepts_the_adapters_flags(tmp_path, monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    args = lora_serve_args({"lora0": tmp_path / "l0", "lora1": tmp_path / "l1"})
    parsed = parse_serve_args([str(tmp_path), *args])
    assert parsed.enable_lora and parsed.max_loras == 2 and parsed.max_lora_rank == 8
    assert sorted(m.name for m in parsed.lora_modules) == ["lora0", "lora1"]
    assert lora_serve_args({}) == []


@pytest.mark.parametrize("sampling_mix", [False, True])
def test_the_load_sends_some_requests_to_each_adapter_and_scores_none_of_them(sampling_mix):
    args = argparse.Namespace(requests=300, concurrency=64, max_tokens=16,
                              sampling_mix=sampling_mix, structured=False,
                              lora_adapters={"lora0": "d0", "lora1": "d1"})
    load = soak_load(args)
    load.model = "dummy"
    models = {}
    for index in range(args.requests):
        stream, _, sampling = load.plan(index)
        model = request_body(load, index, stream, sampling)["model"]
        models[model] = models.get(model, 0) + 1
        assert scored(sampling) == (model == "dummy" and sampling in ("greedy", "logprobs", "stop"))
    assert set(models) == {"dummy", "lora0", "lora1"} and min(models.values()) > 20
