"""Each part of a model's decode-step cost: from a measured table, else a bytes/FLOPs model."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = Path(__file__).with_name("cost_tables")  # one JSON file per model shape


@dataclass(frozen=True)
class Rates:
    """A GPU's effective rates for the bytes/FLOPs model (``name``: how output names it)."""

    bytes_per_s: float
    flops_per_s: float
    name: str = "H200"
    #: The rates of the GPU a table was measured on (its ``measured.device``), where that GPU
    #: is known and is not this one: a table's times convert part by part through the model.
    table_rates: Callable[[str], Rates | None] | None = None


#: One H200's effective decode rates, fitted to measured stage costs (only ratios decide).
FITTED = Rates(bytes_per_s=4.15e12, flops_per_s=550e12)
LAYER_FIXED_S = 35e-6  # one layer's small kernels: norms, rotary, attention, activations
EMBEDDING_FIXED_S = 5e-6
LM_HEAD_FIXED_S = 10e-6
SAMPLER_FIXED_S = 20e-6
SAMPLER_BYTES_PER_LOGIT = 8  # written in fp32, then read once more
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
TABLE_FIELDS = ("layer_ms", "embedding_ms", "lm_head_ms")


def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``key`` of a Hugging Face config object or of its dict."""
    mapping = isinstance(config, Mapping)
    value = config.get(key, default) if mapping else getattr(config, key, default)
    return default if value is None else value


def text_config(config: Any) -> Any:
    """The language model's part of ``config`` (its ``text_config`` where it has one)."""
    return config_value(config, "text_config") or config


def num_hidden_layers(config: Any) -> int:
    """The decoder layers ``config`` declares (0 where it declares none)."""
    return int(config_value(text_config(config), "num_hidden_layers", 0))


def unmodelled_reason(config: Any) -> str | None:
    """Why the bytes/FLOPs model (identical GQA layers, gated MLP or MoE) cannot cost ``config``."""
    config = text_config(config)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not config_value(config, key):
            return f"its config has no {key}"
    if config_value(config, "quantization_config"):
        return "its weights are quantized (their bytes are not modelled)"
    if config_value(config, "kv_lora_rank"):
        return "its attention is MLA (not modelled)"
    if config_value(config, "layers_block_type") or config_value(config, "hybrid_override_pattern"):
        return "its layers are of several kinds (hybrid)"
    kinds = set(config_value(config, "layer_types", []) or [])
    if kinds - {"full_attention", "sliding_attention"}:
        return f"its layers are of several kinds ({', '.join(sorted(map(str, kinds)))})"
    if config_value(config, "mlp_only_layers") or config_value(config, "first_k_dense_replace"):
        return "some of its layers are dense and others MoE"
    if config_value(config, "decoder_sparse_step", 1) != 1:
        return "some of its layers are dense and others MoE (decoder_sparse_step)"
    if not _num_experts(config) and not config_value(config, "intermediate_size"):
        return "its config has no intermediate_size"
    return None


def _num_experts(config: Any) -> int:
    keys = ("num_experts", "num_local_experts", "n_routed_experts")
    return next((int(value) for key in keys if (value := config_value(config, key))), 0)


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only model that its decode cost depends on."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0

    @classmethod
    def from_config(cls, config: Any, dtype_bytes: int | None = None) -> ModelShape:
        """Read a Hugging Face config (object or dict); ``dtype_bytes`` overrides its dtype."""
        config = text_config(config)
        value = functools.partial(config_value, config)
        hidden, heads = int(value("hidden_size")), int(value("num_attention_heads"))
        experts = _num_experts(config)
        expert_size = value("moe_intermediate_size") or value("intermediate_size", 0)
        if dtype_bytes is None:
            dtype = value("torch_dtype") or value("dtype") or "bfloat16"
            dtype_bytes = _DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 2)
        return cls(
            model_type=str(value("model_type", "unknown")), hidden_size=hidden,
            num_layers=int(value("num_hidden_layers")), num_heads=heads,
            num_kv_heads=int(value("num_key_value_heads", heads)),
            head_dim=int(value("head_dim", hidden // heads)),
            intermediate_size=int(value("intermediate_size", 0)),
            vocab_size=int(value("vocab_size")), dtype_bytes=dtype_bytes, num_experts=experts,
            experts_per_token=int(value("num_experts_per_tok", 0)) if experts else 0,
            expert_intermediate_size=int(expert_size) if experts else 0,
            shared_expert_intermediate_size=int(value("shared_expert_intermediate_size", 0)))

    def signature(self) -> str:
        """The key cost tables are filed under: every field the costs depend on."""
        moe = (f"-e{self.num_experts}x{self.experts_per_token}i{self.expert_intermediate_size}"
               f"s{self.shared_expert_intermediate_size}" if self.num_experts else "")
        return (f"{self.model_type}-h{self.hidden_size}-l{self.num_layers}-a{self.num_heads}"
                f"kv{self.num_kv_heads}d{self.head_dim}-i{self.intermediate_size}{moe}"
                f"-v{self.vocab_size}-b{self.dtype_bytes}")

    @property
    def _dense_params(self) -> int:
        """A layer's parameters that every token reads: attention, router, shared expert."""
        attention = 2 * self.hidden_size * self.head_dim * (self.num_heads + self.num_kv_heads)
        if not self.num_experts:
            return attention + 3 * self.hidden_size * self.intermediate_size
        return (attention + self.hidden_size * self.num_experts  # the router
                + 3 * self.hidden_size * self.shared_expert_intermediate_size)

    @property
    def _expert_params(self) -> int:
        return 3 * self.hidden_size * self.expert_intermediate_size

    @property
    def layer_bytes(self) -> int:
        """Weight bytes of one decoder layer, all its experts included."""
        return (self._dense_params + self.num_experts * self._expert_params) * self.dtype_bytes

    @property
    def vocab_bytes(self) -> int:
        """Weight bytes of the embedding (first stage) and of the LM head (last stage)."""
        return self.vocab_size * self.hidden_size * self.dtype_bytes

    def layer_bytes_read(self, batch: int) -> int:
        """Weight bytes one decode step of ``batch`` tokens reads in one layer."""
        experts = min(self.num_experts, batch * self.experts_per_token)
        return (self._dense_params + experts * self._expert_params) * self.dtype_bytes

    def layer_flops(self, batch: int) -> int:
        return 2 * batch * (self._dense_params + self.experts_per_token * self._expert_params)


@dataclass(frozen=True)
class StageCosts:
    """Decode-step costs of a model's parts at one batch size (seconds), and weight bytes."""

    batch: int
    layer_s: float
    embedding_s: float
    head_s: float  # the LM head and the sampler
    layer_bytes: int
    vocab_bytes: int
    source: str  # where the times come from: a measured table, or the bytes/FLOPs model

    def stage_s(self, stage: int, num_stages: int, layers: int) -> float:
        """Predicted decode step of pipeline stage ``stage`` holding ``layers`` layers."""
        fixed = self.embedding_s if stage == 0 else 0.0
        if stage == num_stages - 1:
            fixed += self.head_s
        return fixed + layers * self.layer_s

    def stage_bytes(self, stage: int, num_stages: int, layers: int) -> int:
        """Weight bytes of a stage: its layers, the embedding on the first, the LM head on the
        last (a copy of the embedding where the two are tied)."""
        ends = (stage == 0) + (stage == num_stages - 1)
        return ends * self.vocab_bytes + layers * self.layer_bytes


def _roofline_s(bytes_read: float, flops: float, rates: Rates = FITTED) -> float:
    return max(bytes_read / rates.bytes_per_s, flops / rates.flops_per_s)


def modelled_costs(shape: ModelShape, batch: int, rates: Rates = FITTED) -> StageCosts:
    logits = batch * shape.vocab_size
    head = (_roofline_s(shape.vocab_bytes + logits * shape.dtype_bytes,
                        2 * logits * shape.hidden_size, rates) + LM_HEAD_FIXED_S
            + logits * SAMPLER_BYTES_PER_LOGIT / rates.bytes_per_s + SAMPLER_FIXED_S)
    layer = _roofline_s(shape.layer_bytes_read(batch), shape.layer_flops(batch), rates)
    embedding = 2 * batch * shape.hidden_size * shape.dtype_bytes / rates.bytes_per_s
    at = "" if rates.name == FITTED.name else f" at {rates.name}'s rates"
    return StageCosts(batch=batch, layer_s=layer + LAYER_FIXED_S,
                      embedding_s=embedding + EMBEDDING_FIXED_S, head_s=head,
                      layer_bytes=shape.layer_bytes, vocab_bytes=shape.vocab_bytes,
                      source="the bytes/FLOPs model" + at)


class CostTableError(ValueError):
    """A cost table file the plugin cannot read."""


def read_table(path: Path) -> dict[str, Any]:
    """Load and check one cost table (format: ``cost_tables/README.md``)."""
    try:
        table = json.loads(path.read_text())
        rows = table["batches"]
        assert isinstance(table["signature"], str) and rows
        for row in rows:
            assert int(row["batch"]) >= 1
            assert all(float(row[field]) >= 0 for field in TABLE_FIELDS)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise CostTableError(f"cost table {path.name} is not readable: {exc!r}") from None
    return table


def find_table(shape: ModelShape, directory: Path = TABLES) -> tuple[Path, dict] | None:
    for path in sorted(Path(directory).glob("*.json")):
        if (table := read_table(path))["signature"] == shape.signature():
            return path, table
    return None


def _interpolate(rows: list[dict], batch: int, field: str) -> float:
    """``field`` at ``batch``, linear between the measured batches, the nearest outside."""
    rows = sorted(rows, key=lambda r: int(r["batch"]))
    if batch <= int(rows[0]["batch"]):
        return float(rows[0][field])
    for low, high in zip(rows, rows[1:]):
        b0, b1 = int(low["batch"]), int(high["batch"])
        if batch <= b1:
            share = (batch - b0) / (b1 - b0)
            return float(low[field]) + share * (float(high[field]) - float(low[field]))
    return float(rows[-1][field])


def table_costs(shape: ModelShape, path: Path, table: dict, batch: int,
                rates: Rates = FITTED) -> StageCosts:
    """A measured ``table``'s costs at ``batch``, converted to ``rates``' GPU where the table's
    is another and beyond its largest batch, each part by the model's ratio: what reads memory
    scales by bandwidth, what computes by FLOPs, fixed launch costs not at all."""
    at = min(batch, max(int(row["batch"]) for row in table["batches"]))
    ms = {field: _interpolate(table["batches"], at, field) / 1e3 for field in TABLE_FIELDS}
    device = table.get("measured", {}).get("device", "")
    measured_on = rates.table_rates(device) if rates.table_rates else None
    here = modelled_costs(shape, batch, rates)
    there = modelled_costs(shape, at, measured_on or rates)
    scale = {part: getattr(here, part) / getattr(there, part)
             for part in ("layer_s", "embedding_s", "head_s")}
    how = "" if measured_on is None else (
        f" on {measured_on.name}, converted to {rates.name}: by bandwidth what reads"
        " memory, by FLOPs what computes")
    return StageCosts(batch=batch, layer_s=scale["layer_s"] * ms["layer_ms"],
                      embedding_s=scale["embedding_s"] * ms["embedding_ms"],
                      head_s=scale["head_s"] * ms["lm_head_ms"],
                      layer_bytes=shape.layer_bytes, vocab_bytes=shape.vocab_bytes,
                      source=f"the cost table {path.name} (measured{how})")


def stage_costs(shape: ModelShape, batch: int, directory: Path = TABLES,
                rates: Rates = FITTED) -> StageCosts:
    """``shape``'s costs at ``batch``: its measured table where one exists, else the model."""
    if (found := find_table(shape, directory)) is None:
        return modelled_costs(shape, batch, rates)
    return table_costs(shape, *found, batch, rates)


