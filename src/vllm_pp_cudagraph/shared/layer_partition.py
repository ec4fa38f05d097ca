"""Which layers each pipeline stage builds: vLLM's split, or one chosen from predicted costs."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.settings import (
    LayerPartition, PPCudaGraphSettings, hand_set_partition, set_variable)
from vllm_pp_cudagraph.shared.stage_costs import (
    TABLES, ModelShape, StageCosts, config_value, num_hidden_layers, stage_costs, text_config,
    unmodelled_reason)

SETTING = PPCudaGraphSettings.env_name("layer_partition")
VLLM_ENV = vllm_surface.LAYER_PARTITION_ENV
KV_TOLERANCE = 0.01
MIN_GAIN = 0.01
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # vLLM's CacheConfig default
LOGIT_BYTES = 4  # one logit in the sampler's profiling run (fp32)
GIB = 2**30
LOG_PREFIX = "Layer partition "  # how stage 0's Decision.log_line begins


class LayerPartitionError(ValueError):
    """``VLLM_PP_CUDAGRAPH_LAYER_PARTITION`` cannot be honoured for this engine."""


@dataclass(frozen=True)
class Memory:
    """The memory an engine gives each stage for weights, activations and KV cache."""

    gpu_bytes: int | None = None  # the GPU's total memory, where known
    utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_bytes: int | None = None  # kv_cache_memory_bytes: where set, each stage's KV room

    @property
    def known(self) -> bool:
        return self.kv_cache_bytes is not None or self.gpu_bytes is not None

    @property
    def budget(self) -> int:
        assert self.gpu_bytes is not None
        return int(self.utilization * self.gpu_bytes)

    def describe(self) -> str:
        if self.kv_cache_bytes is not None:
            return (f"kv_cache_memory_bytes={self.kv_cache_bytes} "
                    f"({self.kv_cache_bytes / GIB:.2f} GiB) on every stage")
        return (f"{self.gpu_bytes / GIB:.2f} GiB of GPU memory x gpu_memory_utilization "
                f"{self.utilization}")


@dataclass(frozen=True)
class KVRoom:
    """Each stage's room for the KV cache, and the tokens the engine's cache holds."""

    memory: Memory
    costs: StageCosts
    bytes_per_layer: int  # KV bytes one layer stores per token
    logits_bytes: int  # the sampler's profiling peak on the last stage

    def room(self, stage: int, pp: int, layers: int) -> int:
        """Bytes stage ``stage`` of ``pp`` holding ``layers`` layers has for KV."""
        if self.memory.kv_cache_bytes is not None:
            return self.memory.kv_cache_bytes
        peak = self.logits_bytes if stage == pp - 1 else 0
        return self.memory.budget - self.costs.stage_bytes(stage, pp, layers) - peak

    def per_layer(self, split: tuple[int, ...]) -> Fraction:
        """The KV bytes per layer every stage of ``split`` can give (the fullest stage's)."""
        return min(Fraction(self.room(s, len(split), n), n) for s, n in enumerate(split))

    def tokens(self, split: tuple[int, ...]) -> int:
        return max(0, int(self.per_layer(split) / self.bytes_per_layer))

    def floor(self, base: tuple[int, ...]) -> Fraction:
        """The least KV bytes per layer a stage must keep: ``base``'s less :data:`KV_TOLERANCE`."""
        tolerance = 0 if self.memory.kv_cache_bytes is not None else Fraction(KV_TOLERANCE)
        return (1 - tolerance) * self.per_layer(base)


def balanced_split(costs: StageCosts, kv: KVRoom, num_layers: int, pp: int) -> tuple[int, ...]:
    """The split of ``num_layers`` over ``pp`` stages with the shortest slowest stage, each
    stage a layer and :meth:`KVRoom.floor`; of the fastest, the fewest layers moved."""
    base = vllm_surface.vllm_split(num_layers, pp)
    floor = kv.floor(base)
    budgets = sorted({costs.stage_s(s, pp, n) for s in range(pp)
                      for n in range(1, num_layers - pp + 2)})

    def fits(budget: float) -> list[int] | None:
        """Each stage's most layers within ``budget`` and ``floor``, where they hold them all."""
        most = []
        for stage in range(pp):
            n = 0
            while (n < num_layers and costs.stage_s(stage, pp, n + 1) <= budget
                   and kv.room(stage, pp, n + 1) >= floor * (n + 1)):
                n += 1
            most.append(n)
        return most if min(most) >= 1 and sum(most) >= num_layers else None

    # The least budget that fits (vLLM's split fits its own slowest stage: at most the last).
    low = bisect_left(budgets, True, hi=len(budgets) - 1, key=lambda b: fits(b) is not None)
    if (most := fits(budgets[low])) is None:
        return base
    # ``base`` cut to ``most``; the layers cut go to the stages that cost least after.
    layers = [min(b, m) for b, m in zip(base, most)]
    for _ in range(sum(base) - sum(layers)):
        open_stages = [s for s in range(pp) if layers[s] < most[s]]
        stage = min(open_stages, key=lambda s: (costs.stage_s(s, pp, layers[s] + 1), s))
        layers[stage] += 1
    return tuple(layers)


@dataclass(frozen=True)
class Decision:
    """The layer partition an engine uses, where it comes from, and its predicted costs."""

    source: str  # hand-set, auto (a split other than vLLM's) or vllm
    why: str
    layers: tuple[int, ...] | None = None  # per stage; None: vLLM's, not known here
    costs: StageCosts | None = None
    vllm_layers: tuple[int, ...] | None = None
    kv: KVRoom | None = None
    #: ``auto`` without the GPU's memory: the workers, which read it, may split otherwise.
    undecided: bool = False

    @property
    def noteworthy(self) -> bool:
        """Whether it says more than that vLLM's split applies by default."""
        return self.source != "vllm" or self.vllm_layers is not None

    @property
    def env_value(self) -> str | None:
        """What ``VLLM_PP_LAYER_PARTITION`` must hold for it (None: leave it)."""
        return _join(self.layers) if self.source == "auto" and self.layers else None

    def stage_ms(self, layers: tuple[int, ...]) -> list[float]:
        assert self.costs is not None
        return [1e3 * self.costs.stage_s(s, len(layers), n) for s, n in enumerate(layers)]

    def slowest_ms(self, layers: tuple[int, ...]) -> float:
        return max(self.stage_ms(layers))

    def log_line(self) -> str:
        """The line stage 0 logs: the split in use, then :meth:`describe`'s lines."""
        used = f"{_join(self.layers)} over {len(self.layers)} stages; " if self.layers else ""
        return LOG_PREFIX + used + "; ".join(self.describe())

    def describe(self) -> list[str]:
        """Which partition and why (the summary), then, where costed, each stage's costs."""
        lines, layers, stock, kv = [self.why], self.layers, self.vllm_layers, self.kv
        if self.costs is None or layers is None or stock is None:
            return lines
        pp, start = len(layers), 0
        for stage, (n, ms) in enumerate(zip(layers, self.stage_ms(layers))):
            gib = self.costs.stage_bytes(stage, pp, n) / GIB
            room = "" if kv is None else f", KV room {kv.room(stage, pp, n) / GIB:.2f} GiB"
            lines.append(f"stage {stage}: layers {start}-{start + n - 1} ({n}), predicted "
                         f"{ms:.2f} ms per step, weights {gib:.2f} GiB{room}")
            start += n
        lines.append(f"slowest stage {self.slowest_ms(layers):.2f} ms predicted against "
                     f"{self.slowest_ms(stock):.2f} ms under vLLM's split {_join(stock)}")
        if kv is not None:
            lines.append(f"KV cache {kv.tokens(layers)} tokens predicted against "
                         f"{kv.tokens(stock)} under vLLM's split ({kv.memory.describe()})")
        lines.append(f"costs at batch {self.costs.batch} from {self.costs.source}")
        return lines


def decide(setting: LayerPartition, config: Any, pp: int, batch: int,
           hand_set: str | None = None, *, num_layers: int | None = None,
           dtype_bytes: int | None = None, quantized: bool = False,
           memory: Memory | None = None, max_num_batched_tokens: int | None = None,
           tables: Path = TABLES) -> Decision:
    """The partition for ``config`` (HF, object or dict) at ``pp`` stages, ``max_num_seqs=batch``;
    ``hand_set`` wins. LayerPartitionError: ``auto`` with more stages than layers."""
    if hand_set is not None:
        over = f", which wins over {SETTING}=auto" if setting is LayerPartition.AUTO else ""
        try:
            layers = tuple(int(n) for n in hand_set.split(","))
        except ValueError:
            layers = None
        return Decision("hand-set", f"set by hand: {VLLM_ENV}={hand_set}{over}",
                        layers if layers and len(layers) == pp else None)
    if pp < 2:
        return Decision("vllm", "vLLM's (one pipeline stage: nothing to split)")
    if setting is LayerPartition.VLLM:
        return Decision("vllm", f"vLLM's split ({SETTING}=vllm, the default)")
    total = num_layers or num_hidden_layers(config)
    if total < pp:
        raise LayerPartitionError(
            f"{SETTING}=auto cannot give each of {pp} pipeline stages a layer: the model has "
            f"{total} decoder layers. Use at most {total} stages, or set {SETTING}=vllm.")
    base = vllm_surface.vllm_split(total, pp)
    memory = memory or Memory()
    reason = unmodelled_reason(config) or ("vLLM quantizes its weights (their bytes are not "
                                           "modelled)" if quantized else None)
    if reason is None and not config_value(text_config(config), "num_key_value_heads"):
        reason = ("its config has no num_key_value_heads (the KV cache's bytes per token "
                  "are not known)")
    if reason is None and not memory.known:
        reason = "the GPU's memory is not known (the KV cache's room is not modelled)"
    if reason is not None:
        return Decision("vllm", f"auto keeps vLLM's split {_join(base)}: {reason}", base,
                        vllm_layers=base, undecided=not memory.known)
    shape = ModelShape.from_config(config, dtype_bytes)
    costs = stage_costs(shape, batch, tables)
    kv = KVRoom(memory, costs, 2 * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes,
                min(batch, max_num_batched_tokens or batch) * shape.vocab_size * LOGIT_BYTES)
    if kv.per_layer(base) <= 0:
        return Decision("vllm", f"auto keeps vLLM's split {_join(base)}: a stage has no room "
                        f"left for the KV cache under it ({memory.describe()})", base, costs,
                        base, kv)
    best = balanced_split(costs, kv, total, pp)
    decision = Decision("auto", "", best, costs, base, kv)
    fastest, stock = decision.slowest_ms(best), decision.slowest_ms(base)
    if best == base or fastest > (1 - MIN_GAIN) * stock:
        other = (f"the best other, {_join(best)}, is predicted {fastest:.2f} against "
                 f"{stock:.2f} ms, less than {MIN_GAIN:.0%} faster" if best != base else
                 f"no other split that keeps the KV cache within {KV_TOLERANCE:.0%} of its "
                 f"capacity under it is predicted faster")
        return Decision("vllm", f"auto keeps vLLM's split {_join(base)} for PP={pp} at batch "
                        f"{batch}: {other}", base, costs, base, kv)
    return Decision("auto", f"auto picks {_join(best)} for PP={pp} at batch {batch} (vLLM's "
                    f"split: {_join(base)})", best, costs, base, kv)


def _join(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers))


def gpu_memory_bytes() -> int | None:
    """This process's GPU's total memory; None where CUDA is not initialized (engine core)."""
    import torch
    if not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)


def apply(decision: Decision) -> None:
    """Set ``VLLM_PP_LAYER_PARTITION`` to ``decision``'s split, else back to the process's own
    (an earlier engine here may have set it), before the worker builds its model."""
    value = decision.env_value or hand_set_partition()
    # vLLM takes a split only from this variable (registry: layer-partition).
    set_variable(VLLM_ENV, value)
    vllm_surface.reread_vllm_env(VLLM_ENV, value)
