"""EAGLE drafts for the built-in shapes, with seeded random weights.

Two formats, each a one-layer Llama as vLLM loads it for a dense Qwen3 target:

- EAGLE3 (:func:`write_eagle3_draft`, architecture ``LlamaForCausalLMEagle3``,
  method ``eagle3``): reads three of the target's hidden states, fused by ``fc``.
- EAGLE-1 (:func:`write_eagle_draft`, architecture ``LlamaForCausalLM``, method
  ``eagle``; vLLM renames it ``EagleLlamaForCausalLM``): reads the target's last
  hidden state beside the token's embedding, and borrows the target's
  ``lm_head``.

Their weights are random, so they propose tokens the target mostly rejects;
what a check needs from them is the path: the target's hidden states on the
last pipeline stage (and, for EAGLE3, its aux hidden states travelling between
stages), the draft's forward and graphs on the last stage, and the
verification, all with the target's greedy tokens unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, write_tensors

#: The drafts' own layer count; EAGLE-1 and EAGLE3 drafts have one.
DRAFT_LAYERS = 1

#: The target config's fields a draft copies: its widths, vocabulary, positions and dtype.
TARGET_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                 "hidden_act", "torch_dtype", "bos_token_id", "eos_token_id")


def draft_config(target: dict[str, Any]) -> dict[str, Any]:
    """The EAGLE3 draft's ``config.json`` for a dense Qwen3 ``target`` config."""
    return {
        **{k: target[k] for k in TARGET_FIELDS},
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
    return _write_draft(directory, shape, "EAGLE3", draft_config, draft_weight_shapes)


def _write_draft(directory: str | Path, shape: str, kind: str,
                 make_config: Callable[[dict[str, Any]], dict[str, Any]],
                 weight_shapes: Callable[[dict[str, Any]], dict[str, tuple[int, ...]]]) -> Path:
    target = SHAPES.get(shape)
    if target is None or target["architectures"] != ["Qwen3ForCausalLM"]:
        raise ValueError(f"{kind} drafts are written for dense Qwen3 shapes; not {shape!r}.")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = make_config(target)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_tensors(path, weight_shapes(config), config.get("torch_dtype", "bfloat16"))
    return path


def eagle_draft_config(target: dict[str, Any]) -> dict[str, Any]:
    """The EAGLE-1 draft's ``config.json`` for a dense Qwen3 ``target`` config.

    A Llama config as EAGLE-1 checkpoints ship it: vLLM's ``EAGLEConfig`` (method
    ``eagle``) renames ``LlamaForCausalLM`` to ``EagleLlamaForCausalLM``. Its
    widths are the target's: ``fc`` reads the token's embedding beside the
    target's last hidden state, and the logits come from the target's
    ``lm_head``.
    """
    return {
        **{k: target[k] for k in TARGET_FIELDS},
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": DRAFT_LAYERS,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def eagle_draft_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of an EAGLE-1 draft checkpoint for ``config``.

    What vLLM's ``EagleLlamaForCausalLM`` loads: ``fc`` fuses the embedding and
    the target's hidden state (twice the hidden size in); the first layer has no
    ``input_layernorm`` (vLLM replaces it by an identity, so a weight for it
    would not load) and the model no final norm. No ``lm_head`` either: the
    model has none until vLLM hands it the target's, and a checkpoint tensor
    for it would not load. ``embed_tokens`` is the draft's own, as EAGLE-1
    checkpoints ship it (vLLM keeps it where it differs from the target's).
    """
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (config["vocab_size"], hidden),
        "fc.weight": (hidden, 2 * hidden),
    }
    for i in range(config["num_hidden_layers"]):
        layer = f"layers.{i}."
        if i > 0:
            shapes[layer + "input_layernorm.weight"] = (hidden,)
        shapes.update({
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (q_dim, hidden),
            layer + "self_attn.k_proj.weight": (kv_dim, hidden),
            layer + "self_attn.v_proj.weight": (kv_dim, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q_dim),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
        })
    return shapes


def write_eagle_draft(directory: str | Path, shape: str = "qwen3-0.6b") -> Path:
    """Write an EAGLE-1 draft for the built-in ``shape`` (config and random weights)."""
    return _write_draft(directory, shape, "EAGLE", eagle_draft_config, eagle_draft_weight_shapes)
