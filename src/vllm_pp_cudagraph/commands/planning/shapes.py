"""The model shapes ``plan``, ``check --model`` and ``bench`` know by name (each real
model's ``config.json`` fields that its costs and split depend on), and reading a model's
config by name, directory or file."""

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

QWEN3_4B: dict[str, Any] = {
    **QWEN3_0_6B,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
}

#: The seed's model. MoE: 128 experts, 8 per token, about 3B of 30B active.
QWEN3_30B_A3B: dict[str, Any] = {
    **QWEN3_0_6B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
    "output_router_logits": False,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
}

#: Dense shapes that need two GPUs in bf16 (about 64 and 141 GB of weights).
QWEN3_32B: dict[str, Any] = {
    **QWEN3_0_6B,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
}

LLAMA_3_1_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

#: A vocabulary of the 256 bytes plus specials: text of any kind (JSON for
#: structured outputs) is spelled byte by byte (see :func:`write_byte_tokenizer`).
BYTE_VOCAB = 512


def with_byte_vocab(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the byte-level vocabulary (:data:`BYTE_VOCAB`) and its specials."""
    return {**config, "vocab_size": BYTE_VOCAB, "bos_token_id": 256, "eos_token_id": 257}


SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": QWEN3_0_6B,
    # 27 layers: does not split evenly across 2 pipeline stages.
    "qwen3-0.6b-27l": {**QWEN3_0_6B, "num_hidden_layers": 27},
    "qwen3-4b": QWEN3_4B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "qwen3-32b": QWEN3_32B,
    "llama-3.1-70b": LLAMA_3_1_70B,
    # Byte-level vocabulary, for structured outputs and anything that parses text.
    "qwen3-0.6b-bytes": with_byte_vocab(QWEN3_0_6B),
}


def read_model_config(path: str) -> dict:
    """The Hugging Face config of a model directory, a ``config.json`` or a built-in shape."""
    if path in SHAPES and not Path(path).exists():
        return dict(SHAPES[path])
    where = Path(path)
    file = where / "config.json" if where.is_dir() else where
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model {path}: no readable config.json ({exc}), and not a "
                         f"built-in shape ({', '.join(sorted(SHAPES))})") from None
