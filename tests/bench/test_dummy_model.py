"""Dummy-weight model directories, with a generated tokenizer for serving offline."""

from __future__ import annotations

import json

import pytest

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, token_word, write_model_dir


def test_shapes_split_evenly_and_unevenly_over_two_stages():
    assert SHAPES["qwen3-0.6b"]["num_hidden_layers"] % 2 == 0
    assert SHAPES["qwen3-0.6b-27l"]["num_hidden_layers"] % 2 == 1


def test_unknown_shape_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="qwen3-0.6b"):
        write_model_dir(tmp_path, "llama-7b")


def test_config_only_by_default(tmp_path):
    write_model_dir(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    assert not (tmp_path / "tokenizer.json").exists()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_model_dir(tmp_path_factory.mktemp("m"), tokenizer=True)


def test_generated_tokenizer_covers_every_id_both_ways(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = SHAPES["qwen3-0.6b"]["vocab_size"]
    assert len(tok) == vocab
    ids = [1, 2, 999, 151642, 151643, 151644, 151645, vocab - 1]
    text = tok.decode(ids)
    assert text.split() == [token_word(i) for i in ids]
    assert tok.encode(text) == ids
    assert tok.eos_token_id == SHAPES["qwen3-0.6b"]["eos_token_id"]


def test_vllm_loads_the_generated_tokenizer(model_dir):
    from vllm.tokenizers import get_tokenizer

    tok = get_tokenizer(str(model_dir))
    assert tok.decode(tok.encode("w7 w8 w9")) == "w7 w8 w9"


TINY = {
    **SHAPES["qwen3-0.6b"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_weights

    path = tmp_path_factory.mktemp("tiny")
    (path / "config.json").write_text(json.dumps(TINY))
    write_weights(path, TINY)
    return path


def test_random_weights_load_as_a_qwen3_checkpoint_with_nothing_missing(tiny_dir):
    from transformers import Qwen3ForCausalLM

    model, info = Qwen3ForCausalLM.from_pretrained(tiny_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_random_weights_are_the_same_on_every_write(tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from vllm_pp_cudagraph.commands.bench.dummy_model import WEIGHTS_FILE, write_weights

    write_weights(tmp_path, TINY)
    first, second = load_file(tiny_dir / WEIGHTS_FILE), load_file(tmp_path / WEIGHTS_FILE)
    assert first.keys() == second.keys()
    assert all((first[k] == second[k]).all() for k in first)
    # different tensors of one shape do not share values
    assert not (first["model.layers.0.mlp.up_proj.weight"] == first["model.layers.0.mlp.gate_proj.weight"]).all()


def test_every_layer_changes_the_greedy_output(tiny_dir):
    """Token equality is only evidence if a wrong layer would change the tokens."""
    import torch
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(tiny_dir).eval()
    prompts = torch.tensor([[5, 9], [17, 3], [200, 201], [77, 300]])

    def greedy():
        with torch.no_grad():
            out = model.generate(prompts, max_new_tokens=8, do_sample=False, pad_token_id=0)
        return out[:, 2:]

    reference = greedy()
    assert len({tuple(row.tolist()) for row in reference}) == len(prompts)
    for layer in model.model.layers:
        saved = layer.self_attn.o_proj.weight.data.clone()
        layer.self_attn.o_proj.weight.data.zero_()
        changed = not torch.equal(greedy(), reference)
        layer.self_attn.o_proj.weight.data.copy_(saved)
        assert changed, "a layer's attention output did not affect the tokens"


def test_an_existing_checkpoint_is_kept_not_rewritten(tiny_dir):
    from vllm_pp_cudagraph.commands.bench.dummy_model import WEIGHTS_FILE, write_weights

    target = tiny_dir / WEIGHTS_FILE
    before = target.stat().st_mtime_ns
    assert write_weights(tiny_dir, TINY) == target
    assert target.stat().st_mtime_ns == before
    assert not list(tiny_dir.glob("*.partial"))


def test_byte_shape_tokenizer_spells_any_text_and_decodes_every_id(tmp_path):
    """Structured outputs need a vocabulary that can spell JSON; every id the
    model may sample must decode."""
    from transformers import AutoTokenizer

    from vllm_pp_cudagraph.commands.bench.dummy_model import BYTE_VOCAB

    path = write_model_dir(tmp_path, "qwen3-0.6b-bytes", tokenizer=True)
    tok = AutoTokenizer.from_pretrained(str(path))
    text = '{"colour": "grün", "n": [1, 2.5e-3, null], "ok": true}\n'
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode())
    assert tok.decode(ids) == text
    assert len(tok) == BYTE_VOCAB and tok.eos_token_id == 257
    assert all(tok.decode([i]) for i in range(BYTE_VOCAB))
