"""One engine's plan: every decision the plugin makes for an engine, made once by
:func:`plan_engine` from the settings and the engine's config, and read by the worker's
runner factory, the runner, the scheduler hook, the engine check and ``check``."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.compat import support
from vllm_pp_cudagraph.planning import layer_partition
from vllm_pp_cudagraph.settings import (
    DecodeCadence,
    LayerPartition,
    PPCudaGraphSettings,
    hand_set_partition,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

#: Cadences that may let a request decode sooner than vLLM's (``balance`` only delays).
LIFTING = frozenset({DecodeCadence.AUTO, DecodeCadence.MERGE, DecodeCadence.FILL})


@dataclass(frozen=True)
class EnginePlan:
    """What the plugin does for one engine. Every process of the engine computes the same
    plan from the same inputs; the layer split under ``auto`` needs the GPU's memory, which
    only a worker reads (``split_decided`` says whether this plan had it)."""

    refusal: str | None
    """Why stock vLLM of this release fails this engine, and what to change."""
    stand_aside: str | None
    """Why the workers run vLLM's own runner; None where they run the plugin's."""
    no_pipeline: bool
    cadence: DecodeCadence
    """The decode cadence the engine core's scheduler runs."""
    asked_cadence: DecodeCadence
    direct_handoff: bool
    direct_handoff_blocker: str | None
    layer_partition: LayerPartition
    layers: tuple[int, ...] | None
    """Layers per stage, where known (vLLM's split under the default is known only to vLLM)."""
    split_decided: bool
    partition: layer_partition.Decision = field(compare=False, repr=False)

    @property
    def plugin_runner(self) -> bool:
        return self.refusal is None and self.stand_aside is None

    @property
    def predicted_stage_ms(self) -> list[float] | None:
        """Each stage's predicted decode-step time, where the split was costed."""
        if self.partition.costs is None or not self.layers:
            return None
        return self.partition.stage_ms(self.layers)

    def record(self) -> dict[str, Any]:
        """The plan as plain values, for ``bench``, ``check`` and the metrics snapshot."""
        return {"plugin_runner": self.plugin_runner, "refusal": self.refusal,
                "stand_aside": self.stand_aside, "cadence": str(self.cadence),
                "asked_cadence": str(self.asked_cadence), "direct_handoff": self.direct_handoff,
                "direct_handoff_blocker": self.direct_handoff_blocker,
                "layer_partition": str(self.layer_partition),
                "layers": list(self.layers) if self.layers else None,
                "split_source": self.partition.source, "split_why": self.partition.why,
                "split_noteworthy": self.partition.noteworthy,
                "predicted_stage_ms": self.predicted_stage_ms}


def _stand_aside(settings: PPCudaGraphSettings, vllm_config: VllmConfig) -> str | None:
    if reason := support.no_pipeline_reason(vllm_config):
        return reason
    if not vllm_config.use_v2_model_runner:
        return "vLLM runs this model on its V1 runner"
    return support.unproven_reason(vllm_config, settings.allow_unproven)


def _cadence(settings: PPCudaGraphSettings, vllm_config: VllmConfig, stand_aside: str | None
             ) -> DecodeCadence:
    """``settings.decode_cadence`` where vLLM's MRV2 PP cadence exists to change and the
    async scheduler (the one the ``decode-cadence`` patch wraps) runs it. Not with
    speculative decoding (its rejected drafts reach the first stages through the same
    ring, unmeasured with consecutive decodes) nor a KV connector (its requests wait on
    transfers the cadence does not see)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    if (stand_aside or support.drafting(vllm_config) is not None
            or getattr(vllm_config, "kv_transfer_config", None) is not None
            or not issubclass(vllm_config.scheduler_config.get_scheduler_cls(),
                              AsyncScheduler)):
        return DecodeCadence.VLLM
    return settings.decode_cadence


def _handoff_blocker(vllm_config: VllmConfig) -> str | None:
    if vllm_config.parallel_config.pipeline_parallel_size <= 1:
        return "no pipeline parallelism"
    if support.drafting(vllm_config) is not None:
        return "speculative decoding (its drafts change what a step hands on)"
    return None


def plan_engine(settings: PPCudaGraphSettings, vllm_config: VllmConfig,
                gpu_memory_bytes: int | None = None) -> EnginePlan:
    """The plan for the engine of ``vllm_config`` under ``settings`` and the process's
    hand-set split (``settings.hand_set_partition``); ``gpu_memory_bytes`` is this GPU's (a
    worker's), which the ``auto`` layer split needs."""
    no_pipeline = support.no_pipeline_reason(vllm_config) is not None
    partition = layer_partition.decide_for(vllm_config, settings.layer_partition,
                                           hand_set_partition(), gpu_memory=gpu_memory_bytes)
    refusal = None if no_pipeline else support.known_failure(vllm_config, partition.layers)
    stand_aside = _stand_aside(settings, vllm_config)
    blocker = _handoff_blocker(vllm_config) if settings.direct_handoff else None
    return EnginePlan(
        refusal=refusal, stand_aside=stand_aside, no_pipeline=no_pipeline,
        cadence=_cadence(settings, vllm_config, stand_aside),
        asked_cadence=settings.decode_cadence,
        direct_handoff=settings.direct_handoff and blocker is None and stand_aside is None,
        direct_handoff_blocker=blocker, layer_partition=settings.layer_partition,
        layers=partition.layers, split_decided=not partition.undecided, partition=partition)


#: The engine core's plans by engine config: its scheduler hook and its engine check share one.
_engine_core_plans: dict[int, tuple[weakref.ref, PPCudaGraphSettings, EnginePlan]] = {}


def engine_core_plan(settings: PPCudaGraphSettings, vllm_config: VllmConfig) -> EnginePlan:
    """The engine core's plan for the engine of ``vllm_config``, computed on first use (the
    scheduler hook or the engine check, whichever comes first) and shared after."""
    key = id(vllm_config)
    held = _engine_core_plans.get(key)
    new_config = held is None or held[0]() is not vllm_config
    if new_config or held[1] != settings:
        held = (weakref.ref(vllm_config), settings, plan_engine(settings, vllm_config))
        _engine_core_plans[key] = held
    if new_config:  # dropped with its config, so a later config at this id plans afresh
        weakref.finalize(vllm_config, _engine_core_plans.pop, key, None)
    return held[2]
