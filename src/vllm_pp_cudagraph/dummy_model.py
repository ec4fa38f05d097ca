"""Model configs with the shapes of real models, for runs with dummy weights.

vLLM can run a model from just its ``config.json`` with ``load_format="dummy"``
and ``skip_tokenizer_init=True``: no download, same kernels and shapes as the
real model. Used by the GPU checks and the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": QWEN3_0_6B,
    # 27 layers: does not split evenly across 2 pipeline stages.
    "qwen3-0.6b-27l": {**QWEN3_0_6B, "num_hidden_layers": 27},
}


def write_model_dir(
    directory: str | Path, shape: str = "qwen3-0.6b", tokenizer: bool = False
) -> Path:
    """Write ``config.json`` for a built-in shape into ``directory``.

    With ``tokenizer=True`` also write a tokenizer covering the whole
    vocabulary (see :func:`write_tokenizer`), so servers and clients that
    speak text work offline.
    """
    if shape not in SHAPES:
        raise ValueError(f"Unknown model shape {shape!r}; choose one of {sorted(SHAPES)}.")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = SHAPES[shape]
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer:
        write_tokenizer(path, config)
    return path


SPECIAL_TOKENS = {151643: "<|endoftext|>", 151645: "<|im_end|>"}


def token_word(token_id: int) -> str:
    """The text of ``token_id`` in the generated tokenizer."""
    return SPECIAL_TOKENS.get(token_id, "[UNK]" if token_id == 0 else f"w{token_id}")


def write_tokenizer(path: Path, config: dict[str, Any]) -> None:
    """A word-level tokenizer with one word per id, ``w1`` .. ``w{vocab-1}``.

    Every id a dummy-weight model can sample decodes to a distinct word and
    back, so outputs served as text compare exactly, and a prompt of N words
    is N tokens. Qwen's special-token ids keep their usual names.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token_word(i): i for i in range(config["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS.values()))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "[UNK]",
                "eos_token": SPECIAL_TOKENS[config.get("eos_token_id", 151645)],
                "model_max_length": config["max_position_embeddings"],
            },
            indent=2,
        )
    )
