"""Model configs with the shapes of real models, for runs without a download.

A model directory holds the real model's ``config.json`` and, optionally, a
checkpoint of seeded random weights (:func:`write_weights`). vLLM can also run
from the config alone with ``load_format="dummy"``: same kernels and shapes,
but its dummy weights are tiny (uniform in +-1e-3) and the same for every
layer, so the layers barely move the residual stream and each output token is
close to a function of the previous token alone. Token equality between two
runs then says little about the layers, the attention or the KV cache; the
random checkpoint is what the equality checks use. Used by the GPU checks and
the benchmark.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path
from typing import Any

# The shapes live with the planner, which reads them without the bench.
from vllm_pp_cudagraph.commands.planning.shapes import (  # noqa: E402
    BYTE_VOCAB,
    QWEN3_0_6B,
    SHAPES,
    with_byte_vocab,
)

#: Largest random checkpoint written: bigger shapes run on vLLM's dummy weights.
RANDOM_WEIGHTS_MAX_PARAMS = 5_000_000_000


def has_random_weights(shape: str) -> bool:
    """Whether :func:`write_weights` writes a checkpoint for ``shape``: dense Qwen3 up to 4B."""
    config = SHAPES[shape]
    if config["architectures"] != QWEN3_0_6B["architectures"]:
        return False
    params = sum(math.prod(dims) for dims in qwen3_weight_shapes(config).values())
    return params <= RANDOM_WEIGHTS_MAX_PARAMS


def write_model_dir(
    directory: str | Path,
    shape: str = "qwen3-0.6b",
    tokenizer: bool = False,
    weights: bool = False,
) -> Path:
    """Write ``config.json`` for a built-in shape into ``directory``.

    With ``tokenizer=True`` also write a tokenizer covering the whole
    vocabulary (see :func:`write_tokenizer`), so servers and clients that
    speak text work offline. With ``weights=True`` also write a checkpoint
    of seeded random weights (see :func:`write_weights`).
    """
    if shape not in SHAPES:
        raise ValueError(f"Unknown model shape {shape!r}; choose one of {sorted(SHAPES)}.")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = SHAPES[shape]
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer and config["vocab_size"] == BYTE_VOCAB:
        write_byte_tokenizer(path, config)
    elif tokenizer:
        write_tokenizer(path, config)
    if weights:
        if not has_random_weights(shape):
            raise ValueError(f"Random weights are written for dense Qwen3 shapes up to 4B only; "
                             f"run {shape!r} with vLLM's dummy weights (--weights dummy).")
        write_weights(path, config)
    return path


def qwen3_weight_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a Hugging Face Qwen3 checkpoint for ``config``."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        shapes.update(
            {
                layer + "input_layernorm.weight": (hidden,),
                layer + "post_attention_layernorm.weight": (hidden,),
                layer + "self_attn.q_proj.weight": (q_dim, hidden),
                layer + "self_attn.k_proj.weight": (kv_dim, hidden),
                layer + "self_attn.v_proj.weight": (kv_dim, hidden),
                layer + "self_attn.o_proj.weight": (hidden, q_dim),
                layer + "self_attn.q_norm.weight": (head_dim,),
                layer + "self_attn.k_norm.weight": (head_dim,),
                layer + "mlp.gate_proj.weight": (inter, hidden),
                layer + "mlp.up_proj.weight": (inter, hidden),
                layer + "mlp.down_proj.weight": (hidden, inter),
            }
        )
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    return shapes


WEIGHTS_FILE = "model.safetensors"


def write_weights(path: Path, config: dict[str, Any], seed: int = 0, std: float = 0.02) -> Path:
    """Write seeded random weights for the Qwen3 ``config`` (see :func:`write_tensors`)."""
    return write_tensors(path, qwen3_weight_shapes(config), config.get("torch_dtype", "bfloat16"),
                         seed, std)


def write_tensors(path: Path, shapes: dict[str, tuple[int, ...]], dtype_name: str = "bfloat16",
                  seed: int = 0, std: float = 0.02) -> Path:
    """Write seeded random tensors of ``shapes`` as ``model.safetensors``.

    Matrices are normal with standard deviation ``std`` (the usual init for
    this family), norm weights are one, so every layer changes the result
    and greedy outputs depend on the whole forward pass. Each tensor draws
    from its own generator seeded by ``seed`` and its name, so the file is
    the same on every machine. An existing file is kept, so a directory
    serves every engine that needs the same shape.
    """
    import torch
    from safetensors.torch import save_file

    target = Path(path) / WEIGHTS_FILE
    if target.exists():
        return target
    dtype = getattr(torch, dtype_name)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
            continue
        # crc32, not hash(): str hashes change between processes, the weights must not.
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        tensors[name] = (torch.randn(shape, generator=generator) * std).to(dtype)
    # Per-process name: engines started side by side may write the same file.
    partial = target.with_suffix(f".{os.getpid()}.partial")
    save_file(tensors, str(partial), metadata={"format": "pt"})
    partial.rename(target)
    return target


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


def write_byte_tokenizer(path: Path, config: dict[str, Any]) -> None:
    """A byte-level tokenizer: ids 0-255 are the bytes, 256 and 257 end text.

    The rest of the vocabulary (up to ``vocab_size``) are reserved special
    tokens, so every id the model can sample decodes. Any text, JSON included,
    encodes, which a structured-output grammar needs.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}  # id = the byte it stands for
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_end|>"] + [
        f"<|reserved_{i}|>" for i in range(258, config["vocab_size"])
    ]
    tok.add_special_tokens(specials)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                # Chat requests are the messages' contents, one per line.
                "chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                "model_max_length": config["max_position_embeddings"],
            },
            indent=2,
        )
    )


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (the ByteLevel alphabet)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table
