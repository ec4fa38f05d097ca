"""One engine's plan: what the plugin does for an engine, decided once from its settings
and config, and read by the runner, the engine check and ``check``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_pp_cudagraph import support
from vllm_pp_cudagraph.decode_cadence import config_cadence, lifts_decodes
from vllm_pp_cudagraph.settings import DecodeCadence, LayerPartition, PPCudaGraphSettings


@dataclass(frozen=True)
class EnginePlan:
    """Every decision the plugin makes for one engine that its settings and config decide.

    Every process of the engine computes the same plan from the same inputs. What
    only a worker knows (its GPU's memory for the ``auto`` layer split, its pipeline
    group's communicator) is decided there.
    """

    refusal: str | None
    """Why stock vLLM of this release fails this engine, with what to change; the engine
    is refused at start."""
    stand_aside: str | None
    """Why the workers run vLLM's own runner; None where they run the plugin's."""
    no_pipeline: bool
    """Whether ``stand_aside`` is for PP=1 (said at INFO: nothing to do, nothing wrong)."""
    cadence: DecodeCadence
    """The decode cadence the engine core's scheduler runs."""
    asked_cadence: DecodeCadence
    """The cadence the settings ask for (``cadence`` where the engine lets it change)."""
    direct_handoff: bool
    """Whether the stages hand tensors on without per-step metadata (where each stage's
    pipeline group allows it: stage_handoff.group_blocker)."""
    direct_handoff_blocker: str | None
    """Why the direct hand-off stands aside where it was asked for, or None."""
    layer_partition: LayerPartition

    @property
    def plugin_runner(self) -> bool:
        """Whether the workers build the plugin's runner."""
        return self.refusal is None and self.stand_aside is None

    @property
    def needs_plugin_workers(self) -> bool:
        """Whether a worker without the plugin's runner would serve wrong tokens: the
        cadence lifts decodes, or ``auto`` splits the layers."""
        return lifts_decodes(self.cadence) or self.layer_partition is LayerPartition.AUTO


def _direct_handoff_blocker(vllm_config: Any) -> str | None:
    if vllm_config.parallel_config.pipeline_parallel_size <= 1:
        return "no pipeline parallelism"
    if getattr(vllm_config, "speculative_config", None) is not None:
        return "speculative decoding (its drafts change what a step hands on)"
    return None


def _scheduler_cadence(vllm_config: Any, cadence: DecodeCadence) -> DecodeCadence:
    """``cadence`` where the engine core runs the async scheduler (the one the
    ``decode-cadence`` patch wraps) and vLLM's MRV2 PP cadence exists to change."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    if not issubclass(vllm_config.scheduler_config.get_scheduler_cls(), AsyncScheduler):
        return DecodeCadence.VLLM
    return config_cadence(vllm_config, cadence)


def plan_engine(settings: PPCudaGraphSettings, vllm_config: Any) -> EnginePlan:
    """The plan for the engine of ``vllm_config`` under ``settings``."""
    no_pipeline = support.no_pipeline_reason(vllm_config)
    refusal = None if no_pipeline else support.known_failure(vllm_config)
    stand_aside = no_pipeline or support.stand_aside_reason(vllm_config,
                                                            settings.allow_unproven)
    blocker = _direct_handoff_blocker(vllm_config) if settings.direct_handoff else None
    return EnginePlan(
        refusal=refusal,
        stand_aside=stand_aside,
        no_pipeline=no_pipeline is not None,
        cadence=_scheduler_cadence(vllm_config, settings.decode_cadence),
        asked_cadence=settings.decode_cadence,
        direct_handoff=settings.direct_handoff and blocker is None and stand_aside is None,
        direct_handoff_blocker=blocker,
        layer_partition=settings.layer_partition,
    )
