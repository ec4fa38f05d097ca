"""Dummy-weight model directories, with a generated tokenizer for serving offline."""

from __future__ import annotations

import json

import pytest

from vllm_pp_cudagraph.dummy_model import SHAPES, token_word, write_model_dir


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
