"""EAGLE3 draft models for the built-in shapes, with seeded random weights.

A draft is a one-layer Llama that reads three of the target's hidden states
(vLLM's EAGLE3 format, architecture ``LlamaForCausalLMEagle3``). Its weights
are random, so it proposes tokens the target mostly rejects; what a check needs
from it is the path: the target's aux hidden states travelling between
pipeline stages, the draft's forward and graphs on the last stage, and the
verification, all with the target's greedy tokens unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.bench.dummy_model import SHAPES, write_tensors

#: The draft's own layer count; EAGLE3 drafts have one.
DRAFT_LAYERS = 1


def draft_config(target: dict[str, Any]) -> dict[str, Any]:
    """The draft's ``config.json`` for a dense Qwen3 ``target`` config."""
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
            "hidden_act", "torch_dtype", "bos_token_id", "eos_token_id")
    return {
        **{k: target[k] for k in keep},
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": DRAFT_LAYERS,
        "draft_vocab_size": target["vocab_size"],
        "target_hidden_size": target["hidden_size"],
        "tie_word_embeddings": False,
    }


def draft_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of an EAGLE3 draft checkpoint for ``config``.

    The layer reads the token embedding and the fused hidden state side by
    side, so its q/k/v projections take twice the hidden size; ``fc`` fuses
    the target's three aux hidden states.
    """
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    layer = "midlayer."
    return {
        "embed_tokens.weight": (config["vocab_size"], hidden),
        "fc.weight": (hidden, 3 * config["target_hidden_size"]),
        layer + "input_layernorm.weight": (hidden,),
        layer + "hidden_norm.weight": (hidden,),
        layer + "post_attention_layernorm.weight": (hidden,),
        layer + "self_attn.q_proj.weight": (q_dim, 2 * hidden),
        layer + "self_attn.k_proj.weight": (kv_dim, 2 * hidden),
        layer + "self_attn.v_proj.weight": (kv_dim, 2 * hidden),
        layer + "self_attn.o_proj.weight": (hidden, q_dim),
        layer + "mlp.gate_proj.weight": (inter, hidden),
        layer + "mlp.up_proj.weight": (inter, hidden),
        layer + "mlp.down_proj.weight": (hidden, inter),
        "norm.weight": (hidden,),
        "lm_head.weight": (config["draft_vocab_size"], hidden),
    }


def write_eagle3_draft(directory: str | Path, shape: str = "qwen3-0.6b") -> Path:
    """Write an EAGLE3 draft for the built-in ``shape`` (config and random weights)."""
    target = SHAPES.get(shape)
    if target is None or target["architectures"] != ["Qwen3ForCausalLM"]:
        raise ValueError(f"EAGLE3 drafts are written for dense Qwen3 shapes; not {shape!r}.")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = draft_config(target)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_tensors(path, draft_weight_shapes(config), config.get("torch_dtype", "bfloat16"))
    return path
