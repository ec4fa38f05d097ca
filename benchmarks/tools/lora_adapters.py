"""Seeded random LoRA adapters (PEFT's layout) for a built-in dense Qwen3 shape, for the soak's
``--lora``: both matrices random, so a request served with the wrong adapter, or none, shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_lora_adapter(path: str | Path, config: dict[str, Any], rank: int = 8,
                       seed: int = 0) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` for ``config``."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    q_size, kv_size = heads * head_dim, config["num_key_value_heads"] * head_dim
    features = {"q_proj": (hidden, q_size), "k_proj": (hidden, kv_size),
                "v_proj": (hidden, kv_size), "o_proj": (q_size, hidden)}  # (in, out)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            features_in, features_out = features[target]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            for name, shape in (("lora_A", (rank, features_in)), ("lora_B", (features_out, rank))):
                weight = torch.randn(shape, generator=generator) * 0.02
                tensors[f"{prefix}.{name}.weight"] = weight.to(torch.bfloat16)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "target_modules": list(TARGETS),
        "base_model_name_or_path": "dummy", "fan_in_fan_out": False,
    }, indent=2))
    return path


def lora_serve_args(adapters: dict[str, Path], rank: int = 8) -> list[str]:
    """``vllm serve`` flags serving ``adapters`` (name -> directory) beside the base model."""
    if not adapters:
        return []
    return ["--enable-lora", "--max-loras", str(len(adapters)), "--max-lora-rank", str(rank),
            "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]


def lora_mix(adapters: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Sampling-mix entries sending a request to each adapter, greedy."""
    return {name: {"model": name} for name in adapters}
