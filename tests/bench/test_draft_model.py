"""EAGLE drafts for the random Qwen3 shapes, read by the installed vLLM's own config
classes and draft model, on CPU: the GPU tests serve them at PP=2."""

from __future__ import annotations

import json

import pytest

from vllm_pp_cudagraph.commands.bench.draft_model import (
    DRAFT_LAYERS,
    draft_config,
    eagle_draft_config,
    write_eagle_draft,
)
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, WEIGHTS_FILE, write_model_dir

TARGET = SHAPES["qwen3-0.6b"]

#: Each method's draft config, and the architecture vLLM's EAGLEConfig makes of it.
DRAFTS = {
    "eagle": (eagle_draft_config, "EagleLlamaForCausalLM"),
    "eagle3": (draft_config, "LlamaForCausalLMEagle3"),
}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """The random Qwen3-0.6B target's directory as the GPU tests write it (config only:
    vLLM's config classes read no weights)."""
    return write_model_dir(tmp_path_factory.mktemp("target"), "qwen3-0.6b")


@pytest.fixture(scope="module")
def eagle_draft(tmp_path_factory):
    return write_eagle_draft(tmp_path_factory.mktemp("eagle"))


def _config_only(tmp_path, method: str):
    make, _ = DRAFTS[method]
    (tmp_path / "config.json").write_text(json.dumps(make(TARGET)))
    return tmp_path


def test_the_eagle_draft_is_one_llama_layer_with_the_targets_widths(eagle_draft):
    from safetensors import safe_open

    config = json.loads((eagle_draft / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == DRAFT_LAYERS == 1
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "rope_theta", "max_position_embeddings"):
        assert config[key] == TARGET[key], key
    with safe_open(eagle_draft / WEIGHTS_FILE, "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        norm = f.get_tensor("layers.0.post_attention_layernorm.weight")
    hidden, q_dim = TARGET["hidden_size"], TARGET["num_attention_heads"] * TARGET["head_dim"]
    assert shapes["fc.weight"] == (hidden, 2 * hidden)  # the embedding beside the hidden state
    assert shapes["embed_tokens.weight"] == (TARGET["vocab_size"], hidden)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (q_dim, hidden)
    # What vLLM's EagleLlamaForCausalLM has no place for: the first layer's input norm
    # (an identity there), a final norm, an lm_head (it takes the target's).
    assert not {"layers.0.input_layernorm.weight", "norm.weight", "lm_head.weight"} & set(shapes)
    assert bool((norm == 1).all())


def test_eagle_drafts_are_written_for_dense_qwen3_shapes_only(tmp_path):
    with pytest.raises(ValueError, match="dense Qwen3"):
        write_eagle_draft(tmp_path, "qwen3-30b-a3b")
    with pytest.raises(ValueError, match="dense Qwen3"):
        write_eagle_draft(tmp_path, "llama-7b")


def _speculative_config(method: str, draft, target_dir, pp: int):
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig

    target = ModelConfig(model=str(target_dir), skip_tokenizer_init=True, max_model_len=4096)
    return SpeculativeConfig(method=method, model=str(draft), num_speculative_tokens=3,
                             target_model_config=target,
                             target_parallel_config=ParallelConfig(pipeline_parallel_size=pp))


def _skip_where_drafts_take_the_pipeline():
    """vLLM releases that give the draft the target's pipeline size (0.26: drafts without
    SupportsPP are refused at PP>1) take no speculative draft under PP at all."""
    from vllm.config import ParallelConfig, SpeculativeConfig

    draft = SpeculativeConfig.create_draft_parallel_config(
        ParallelConfig(pipeline_parallel_size=2), 1)
    if draft.pipeline_parallel_size != 1:
        pytest.skip("this vLLM gives a draft the target's pipeline size and refuses drafts "
                    "without SupportsPP at PP>1 (ModelConfig.verify_with_parallel_config), "
                    "where vLLM 0.33 builds the draft on the last stage alone")


@pytest.mark.parametrize("method", sorted(DRAFTS))
def test_vllm_takes_the_draft_for_its_method_on_the_last_of_two_stages(method, target_dir,
                                                                        tmp_path):
    """vLLM's own SpeculativeConfig for the random Qwen3-0.6B target at PP=2: the method
    stays, EAGLEConfig names the draft's architecture, vLLM's registry knows it, and the
    draft runs on one stage (the last) with the target's hidden size."""
    from vllm.model_executor.models import ModelRegistry

    _skip_where_drafts_take_the_pipeline()
    _, architecture = DRAFTS[method]
    spec = _speculative_config(method, _config_only(tmp_path, method), target_dir, pp=2)
    draft = spec.draft_model_config
    assert spec.method == method and spec.num_speculative_tokens == 3
    assert draft.architectures == [architecture]
    assert architecture in ModelRegistry.get_supported_archs()
    assert draft.get_hidden_size() == TARGET["hidden_size"]
    assert draft.get_vocab_size() == TARGET["vocab_size"]
    assert spec.draft_parallel_config.pipeline_parallel_size == 1


@pytest.mark.parametrize("method", sorted(DRAFTS))
def test_vllm_takes_the_draft_without_a_pipeline_too(method, target_dir, tmp_path):
    spec = _speculative_config(method, _config_only(tmp_path, method), target_dir, pp=1)
    assert spec.method == method
    assert spec.draft_model_config.architectures == [DRAFTS[method][1]]


def _build_eagle_draft(spec, monkeypatch, pp: int, stage: int):
    """vLLM's EagleLlamaForCausalLM for ``spec`` on CPU, built as MRV2's load_eagle_model
    builds it on stage ``stage`` of ``pp`` (same VllmConfig as the target's), with the
    attention layers' names it registered. CPU has no attention backend: Triton's class
    stands in (only its name and shapes are read while building)."""
    import torch
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.platforms import current_platform
    from vllm.utils.torch_utils import set_default_torch_dtype
    from vllm.v1.attention import selector

    backend = "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"
    monkeypatch.setattr(type(current_platform), "get_attn_backend_cls",
                        classmethod(lambda cls, *args, **kwargs: backend))
    selector._cached_get_attn_backend.cache_clear()
    config = VllmConfig(model_config=spec.target_model_config,
                        parallel_config=ParallelConfig(pipeline_parallel_size=pp),
                        speculative_config=spec, device_config=DeviceConfig(device="cpu"))
    config.parallel_config.rank = stage  # as vLLM's WorkerBase sets it
    try:
        with set_default_torch_dtype(spec.draft_model_config.dtype), torch.device("cpu"):
            model = initialize_model(vllm_config=config, model_config=spec.draft_model_config)
    finally:
        selector._cached_get_attn_backend.cache_clear()
    return model, list(config.compilation_config.static_forward_context)


@pytest.mark.usefixtures("pp_group")
def test_vllms_eagle_draft_model_loads_every_tensor_of_the_checkpoint(eagle_draft, target_dir,
                                                                       monkeypatch):
    """vLLM's EagleLlamaForCausalLM takes every tensor of the written checkpoint, each into
    its parameter (q/k/v and gate/up stacked), keeps its own embedding and has no lm_head
    of its own (MRV2 hands it the target's). Its attention layer is named past the
    target's 28 layers."""
    import torch
    from safetensors.torch import load_file

    spec = _speculative_config("eagle", eagle_draft, target_dir, pp=1)
    model, layers = _build_eagle_draft(spec, monkeypatch, pp=1, stage=0)
    checkpoint = load_file(eagle_draft / WEIGHTS_FILE)
    model.load_weights(iter(checkpoint.items()))
    assert model.has_own_embed_tokens and not model.has_own_lm_head
    assert not hasattr(model, "lm_head")
    params = dict(model.named_parameters())
    stacked = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
               "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
    parts = {f"layers.0.{part}.weight" for group in stacked.values() for part in group}
    expected = {"model." + name: t for name, t in checkpoint.items() if name not in parts}
    for fused, group in stacked.items():
        expected[f"model.layers.0.{fused}.weight"] = torch.cat(
            [checkpoint[f"layers.0.{part}.weight"] for part in group])
    assert set(params) == set(expected)
    for name, value in expected.items():
        assert torch.equal(params[name].data, value), name
    assert layers == [f"model.layers.{TARGET['num_hidden_layers']}.self_attn.attn"]


@pytest.mark.usefixtures("pp_group")
def test_on_the_last_of_two_stages_vllm_names_the_eagle_draft_layer_as_its_first_layer(
        eagle_draft, target_dir, monkeypatch):
    """Stock vLLM's known failure (0.33), which the plugin refuses at start
    (``support.eagle_draft_layer_clash`` names the same layer): on the last of two
    stages EagleLlamaForCausalLM numbers its layer after the target's layer count on that stage (``get_num_layers(parallel_config)``: 14), not
    after all 28 as the EAGLE3 draft does, so its attention layer takes the name of that
    stage's first target layer, and vLLM refuses a second layer of one name ("Duplicate
    layer name: model.layers.14.self_attn.attn") when MRV2 loads the draft there. If
    this fails, vLLM names the draft otherwise now: drop the release from
    ``support.EAGLE_DRAFT_NAME_CLASH`` and run the GPU serving test with "eagle"."""

    from vllm.config import ParallelConfig

    from vllm_pp_cudagraph.shared import support

    _skip_where_drafts_take_the_pipeline()
    spec = _speculative_config("eagle", eagle_draft, target_dir, pp=2)
    last_stage = ParallelConfig(pipeline_parallel_size=2, rank=1)
    start, end = spec.target_model_config.get_layers_start_end_indices(last_stage)
    _, layers = _build_eagle_draft(spec, monkeypatch, pp=2, stage=1)
    assert (start, end) == (TARGET["num_hidden_layers"] // 2, TARGET["num_hidden_layers"])
    assert layers == [f"model.layers.{start}.self_attn.attn"]
    total = spec.target_model_config.get_total_num_hidden_layers()
    assert support.eagle_draft_layer_clash(2, total) == start
