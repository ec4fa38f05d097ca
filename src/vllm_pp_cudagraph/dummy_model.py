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


def write_model_dir(directory: str | Path, shape: str = "qwen3-0.6b") -> Path:
    """Write ``config.json`` for a built-in shape into ``directory``."""
    if shape not in SHAPES:
        raise ValueError(f"Unknown model shape {shape!r}; choose one of {sorted(SHAPES)}.")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(SHAPES[shape], indent=2))
    return path
