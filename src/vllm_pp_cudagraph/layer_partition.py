"""Which decoder layers each pipeline stage builds: vLLM's split, or one chosen from costs.

vLLM splits the layers evenly (the remainder on the middle stages), whatever the
stages cost besides: the last stage also runs the LM head and the sampler, which
at decode can cost as much as several layers, so the pipeline runs at the speed
of that stage. With ``VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto`` each worker picks,
before it builds its model, the partition whose slowest stage has the shortest
predicted decode step at the engine's batch size (``max_num_seqs``), from the
costs of ``stage_costs.py``, and hands it to vLLM through vLLM's own
``VLLM_PP_LAYER_PARTITION``. The choice is a pure function of the model's
config, the pipeline size and the batch size, so every rank makes the same one.

Rules:

- A partition set by hand in ``VLLM_PP_LAYER_PARTITION`` always wins.
- Every stage gets at least one layer; with more stages than layers ``auto`` is
  refused, naming the setting.
- Room for the KV cache: vLLM gives every stage the same number of KV blocks,
  so the stage with the least memory left after its weights limits the cache.
  No stage's weight bytes (its layers, the embedding on the first stage, the LM
  head on the last) may exceed the heaviest stage's under vLLM's split by more
  than :data:`WEIGHT_TOLERANCE`. A stage with more layers also stores more KV
  bytes per token: where the weights are small next to the GPU's memory, the
  cache holds fewer tokens in the ratio of the largest stage's layer counts
  (``check`` prints both).
- vLLM's split is kept unless another is predicted at least :data:`MIN_GAIN`
  faster; among the fastest, the one that moves the fewest layers wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph import compat
from vllm_pp_cudagraph.settings import LayerPartition, PPCudaGraphSettings
from vllm_pp_cudagraph.stage_costs import (
    TABLES,
    ModelShape,
    StageCosts,
    num_hidden_layers,
    stage_costs,
    unmodelled_reason,
)

SETTING = PPCudaGraphSettings.env_name("layer_partition")
VLLM_ENV = compat.LAYER_PARTITION_ENV
WEIGHT_TOLERANCE = 0.05
MIN_GAIN = 0.01

#: The value this process set in ``VLLM_PP_LAYER_PARTITION`` (not a hand-set one).
_set_here: str | None = None


class LayerPartitionError(ValueError):
    """``VLLM_PP_CUDAGRAPH_LAYER_PARTITION`` cannot be honoured for this engine."""


def vllm_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """vLLM's own split (``get_pp_indices`` without ``VLLM_PP_LAYER_PARTITION``)."""
    split = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        split[-i] += 1
    return tuple(split)


def _most_layers(costs: StageCosts, pp: int, budget_s: float, cap: float,
                 num_layers: int) -> list[int]:
    """For each stage, the most layers it can hold within ``budget_s`` and ``cap`` bytes."""
    most = []
    for stage in range(pp):
        n = 0
        while (n < num_layers and costs.stage_s(stage, pp, n + 1) <= budget_s
               and costs.stage_bytes(stage, pp, n + 1) <= cap):
            n += 1
        most.append(n)
    return most


def _fill(costs: StageCosts, base: tuple[int, ...], most: list[int]) -> tuple[int, ...]:
    """``base`` cut to ``most``, the layers cut given to the stages that cost least after."""
    pp = len(base)
    layers = [min(b, m) for b, m in zip(base, most)]
    for _ in range(sum(base) - sum(layers)):
        open_stages = [s for s in range(pp) if layers[s] < most[s]]
        stage = min(open_stages, key=lambda s: (costs.stage_s(s, pp, layers[s] + 1), s))
        layers[stage] += 1
    return tuple(layers)


def balanced_split(costs: StageCosts, num_layers: int, pp: int) -> tuple[int, ...]:
    """The split of ``num_layers`` over ``pp`` stages with the shortest slowest stage.

    Within the weight rule (module docstring), every stage at least one layer;
    among the fastest, the one closest to vLLM's split (fewest layers moved).
    """
    base = vllm_split(num_layers, pp)
    cap = (1 + WEIGHT_TOLERANCE) * max(costs.stage_bytes(s, pp, n) for s, n in enumerate(base))
    budgets = sorted({costs.stage_s(s, pp, n) for s in range(pp)
                      for n in range(1, num_layers - pp + 2)})

    def fits(budget: float) -> list[int] | None:
        most = _most_layers(costs, pp, budget, cap, num_layers)
        return most if min(most) >= 1 and sum(most) >= num_layers else None

    low, high = 0, len(budgets) - 1  # vLLM's split fits its own slowest stage
    while low < high:
        mid = (low + high) // 2
        if fits(budgets[mid]) is None:
            low = mid + 1
        else:
            high = mid
    most = fits(budgets[low])
    return base if most is None else _fill(costs, base, most)


@dataclass(frozen=True)
class Decision:
    """The layer partition an engine uses, where it comes from, and its predicted costs."""

    source: str
    """``hand-set``, ``auto`` (a split other than vLLM's) or ``vllm``."""
    why: str
    layers: tuple[int, ...] | None = None
    """Layers per stage; None where vLLM's split applies and is not known here."""
    costs: StageCosts | None = None
    vllm_layers: tuple[int, ...] | None = None

    @property
    def noteworthy(self) -> bool:
        """Whether it says more than that vLLM's split applies by default."""
        return self.source != "vllm" or self.vllm_layers is not None

    @property
    def env_value(self) -> str | None:
        """What ``VLLM_PP_LAYER_PARTITION`` must hold for it (None: leave it)."""
        return ",".join(map(str, self.layers)) if self.source == "auto" and self.layers else None

    def stage_ms(self, layers: tuple[int, ...]) -> list[float]:
        assert self.costs is not None
        return [1e3 * self.costs.stage_s(s, len(layers), n) for s, n in enumerate(layers)]

    def slowest_ms(self, layers: tuple[int, ...]) -> float:
        return max(self.stage_ms(layers))

    def describe(self) -> list[str]:
        """Lines that say which partition, why, and (costed) what each stage is predicted
        to cost; the first line alone is the summary."""
        lines = [self.why]
        if self.costs is None or self.layers is None or self.vllm_layers is None:
            return lines
        pp = len(self.layers)
        start = 0
        for stage, (n, ms) in enumerate(zip(self.layers, self.stage_ms(self.layers))):
            gib = self.costs.stage_bytes(stage, pp, n) / 2**30
            lines.append(f"stage {stage}: layers {start}-{start + n - 1} ({n}), predicted "
                         f"{ms:.2f} ms per step, weights {gib:.2f} GiB")
            start += n
        lines.append(f"slowest stage {self.slowest_ms(self.layers):.2f} ms predicted against "
                     f"{self.slowest_ms(self.vllm_layers):.2f} ms under vLLM's split "
                     f"{','.join(map(str, self.vllm_layers))}; most layers on a stage "
                     f"{max(self.layers)} against {max(self.vllm_layers)} (KV bytes per token)")
        lines.append(f"costs at batch {self.costs.batch} from {self.costs.source}")
        return lines


def hand_set(environ: Mapping[str, str]) -> str | None:
    """The partition set by hand in ``VLLM_PP_LAYER_PARTITION``, not by this plugin."""
    value = environ.get(VLLM_ENV)
    return None if value is None or value == _set_here else value


def _parse(value: str, pp: int) -> tuple[int, ...] | None:
    try:
        layers = tuple(int(n) for n in value.split(","))
    except ValueError:
        return None
    return layers if len(layers) == pp else None


def decide(setting: LayerPartition, config: Any, pp: int, batch: int,
           environ: Mapping[str, str] | None = None, *, num_layers: int | None = None,
           dtype_bytes: int | None = None, quantized: bool = False,
           tables: Path = TABLES) -> Decision:
    """The partition an engine of ``config`` (a Hugging Face config, object or dict) at
    ``pp`` stages and ``max_num_seqs=batch`` uses under ``setting``.

    ``num_layers`` is vLLM's count of decoder layers where it differs from the
    config's; ``dtype_bytes`` the engine's weight dtype; ``quantized`` whether
    vLLM quantizes the weights.
    """
    environ = os.environ if environ is None else environ
    if (value := hand_set(environ)) is not None:
        over = f", which wins over {SETTING}=auto" if setting is LayerPartition.AUTO else ""
        return Decision("hand-set", f"set by hand: {VLLM_ENV}={value}{over}", _parse(value, pp))
    if pp < 2:
        return Decision("vllm", "vLLM's (one pipeline stage: nothing to split)")
    if setting is LayerPartition.VLLM:
        return Decision("vllm", f"vLLM's split ({SETTING}=vllm, the default)")
    total = num_layers or num_hidden_layers(config)
    if total < pp:
        raise LayerPartitionError(
            f"{SETTING}=auto cannot give each of {pp} pipeline stages a layer: the model has "
            f"{total} decoder layers. Use at most {total} stages, or set {SETTING}=vllm.")
    base = vllm_split(total, pp)
    reason = unmodelled_reason(config) or ("vLLM quantizes its weights (their bytes are not "
                                           "modelled)" if quantized else None)
    if reason is not None:
        return Decision("vllm", f"auto keeps vLLM's split {_join(base)}: {reason}", base,
                        vllm_layers=base)
    costs = stage_costs(ModelShape.from_config(config, dtype_bytes), batch, tables)
    best = balanced_split(costs, total, pp)
    decision = Decision("auto", "", best, costs, base)
    fastest, stock = decision.slowest_ms(best), decision.slowest_ms(base)
    if fastest > (1 - MIN_GAIN) * stock:
        return Decision("vllm", f"auto keeps vLLM's split {_join(base)} for PP={pp} at batch "
                        f"{batch}: the best other, {_join(best)}, is predicted {fastest:.2f} "
                        f"against {stock:.2f} ms, less than {MIN_GAIN:.0%} faster",
                        base, costs, base)
    return Decision("auto", f"auto picks {_join(best)} for PP={pp} at batch {batch} (vLLM's "
                    f"split: {_join(base)})", best, costs, base)


def _join(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers))


def decide_for(vllm_config: Any, setting: LayerPartition | None = None,
               environ: Mapping[str, str] | None = None) -> Decision:
    """:func:`decide` for an engine's ``VllmConfig`` (``setting`` read from ``environ``
    where not given)."""
    environ = os.environ if environ is None else environ
    if setting is None:
        setting = PPCudaGraphSettings.from_env(environ).layer_partition
    model = vllm_config.model_config
    return decide(
        setting,
        model.hf_text_config,
        vllm_config.parallel_config.pipeline_parallel_size,
        vllm_config.scheduler_config.max_num_seqs,
        environ,
        num_layers=model.get_total_num_hidden_layers(),
        dtype_bytes=getattr(model.dtype, "itemsize", None),
        quantized=model.quantization is not None,
    )


def apply_in_worker(vllm_config: Any) -> Decision:
    """Decide for this worker's engine and hand an ``auto`` split to vLLM.

    Called by the plugin's runner before it builds the model: vLLM reads
    ``VLLM_PP_LAYER_PARTITION`` there (``get_pp_indices``, in each model's
    ``make_layers``) and later where it asks which layers a stage holds, so the
    value stays set for the worker's life.
    """
    global _set_here
    decision = decide_for(vllm_config)
    if (value := decision.env_value) is not None:
        compat.set_vllm_env(VLLM_ENV, value)
        _set_here = value
    elif _set_here is not None and os.environ.get(VLLM_ENV) == _set_here:
        compat.set_vllm_env(VLLM_ENV, None)  # a later engine in this process chose otherwise
        _set_here = None
    return decision
