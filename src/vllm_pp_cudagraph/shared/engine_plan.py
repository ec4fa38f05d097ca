"""One engine's plan: every decision the plugin makes for it, from settings and facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.shared import layer_partition, support
from vllm_pp_cudagraph.shared.settings import (
    DecodeCadence, LayerPartition, PPCudaGraphSettings, hand_set_partition)
from vllm_pp_cudagraph.shared.stage_costs import num_hidden_layers

if TYPE_CHECKING:
    from vllm.config import VllmConfig

#: The scheduler class the API server names for a PP engine on vLLM's async scheduler.
PLUGIN_SCHEDULER = "vllm_pp_cudagraph.engine_core.decode_cadence.PPCadenceScheduler"
#: Cadences that may let a request decode sooner than vLLM's (``balance`` only delays).
LIFTING = frozenset({DecodeCadence.AUTO, DecodeCadence.MERGE, DecodeCadence.FILL})


@dataclass(frozen=True)
class EngineFacts:
    """What a plan reads of an engine: its ``VllmConfig``'s (:meth:`of`), or ``check``'s."""

    pp: int
    model: Any  # the Hugging Face config (object or dict), for the split's costs
    max_num_seqs: int
    max_num_batched_tokens: int | None = None
    num_layers: int | None = None  # vLLM's count, where it differs from the config's
    dtype_bytes: int | None = None
    quantized: bool = False
    gpu_memory_utilization: float = layer_partition.DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None
    v2_runner: bool = True  # whether vLLM builds MRV2 (it does on a GPU)
    cadence_scheduler: bool = True  # whether the engine core runs PLUGIN_SCHEDULER
    async_scheduling: bool | None = True
    speculative: str | None = None  # the drafting method; "" where vLLM names none
    kv_connector: str | None = None  # "" where a KV transfer config names no connector

    @classmethod
    def of(cls, vllm_config: VllmConfig) -> EngineFacts:
        model, cache = vllm_config.model_config, vllm_config.cache_config
        scheduler = vllm_config.scheduler_config
        scheduler_cls = scheduler.get_scheduler_cls()
        drafts = support.drafting(vllm_config)
        transfer = getattr(vllm_config, "kv_transfer_config", None)
        return cls(
            pp=vllm_config.parallel_config.pipeline_parallel_size, model=model.hf_text_config,
            max_num_seqs=scheduler.max_num_seqs,
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            num_layers=model.get_total_num_hidden_layers(),
            dtype_bytes=getattr(model.dtype, "itemsize", None),
            quantized=model.quantization is not None,
            gpu_memory_utilization=cache.gpu_memory_utilization,
            kv_cache_memory_bytes=cache.kv_cache_memory_bytes,
            v2_runner=vllm_config.use_v2_model_runner,
            cadence_scheduler=(f"{scheduler_cls.__module__}.{scheduler_cls.__qualname__}"
                               == PLUGIN_SCHEDULER),
            async_scheduling=getattr(scheduler, "async_scheduling", None),
            speculative=None if drafts is None else str(getattr(drafts, "method", "") or ""),
            kv_connector=None if transfer is None else str(
                getattr(transfer, "kv_connector", "") or ""))


@dataclass(frozen=True)
class EnginePlan:
    """What the plugin does for one engine, alike in each of its processes; only a worker
    knows the GPU's memory ``auto``'s split needs (``split_decided``: this plan had it)."""

    refusal: str | None  # why stock vLLM of this release fails this engine, what to change
    stand_aside: str | None  # why the workers run vLLM's own runner
    no_pipeline: bool
    cadence: DecodeCadence  # what the engine core's scheduler runs
    asked_cadence: DecodeCadence
    direct_handoff: bool
    direct_handoff_blocker: str | None
    layer_partition: LayerPartition
    layers: tuple[int, ...] | None  # per stage, where known (vLLM's default split: to vLLM)
    split_decided: bool
    partition: layer_partition.Decision = field(compare=False, repr=False)

    @property
    def plugin_runner(self) -> bool:
        return self.refusal is None and self.stand_aside is None

    @property
    def predicted_stage_ms(self) -> list[float] | None:
        """Each stage's predicted decode-step time, where the split was costed."""
        costed = self.partition.costs is not None and self.layers
        return self.partition.stage_ms(self.layers) if costed else None

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


def _cadence(settings: PPCudaGraphSettings, facts: EngineFacts, stand_aside: str | None
             ) -> DecodeCadence:
    """``settings.decode_cadence`` where the plugin's scheduler runs the MRV2 PP cadence. Not
    with speculative decoding (rejected drafts reach the first stages through the same ring,
    unmeasured) nor a KV connector (its requests wait on transfers the cadence does not see)."""
    if (stand_aside or facts.speculative is not None or facts.kv_connector is not None
            or not facts.cadence_scheduler):
        return DecodeCadence.VLLM
    return settings.decode_cadence


def plan_engine(settings: PPCudaGraphSettings, facts: EngineFacts,
                gpu_memory_bytes: int | None = None) -> EnginePlan:
    """The plan for ``facts`` under ``settings``; ``auto``'s split needs ``gpu_memory_bytes``."""
    no_pipeline_reason = support.no_pipeline_reason(facts.pp)
    memory = layer_partition.Memory(
        gpu_memory_bytes if facts.kv_cache_memory_bytes is None else None,
        facts.gpu_memory_utilization, facts.kv_cache_memory_bytes)
    partition = layer_partition.decide(
        settings.layer_partition, facts.model, facts.pp, facts.max_num_seqs,
        hand_set_partition(), num_layers=facts.num_layers, dtype_bytes=facts.dtype_bytes,
        quantized=facts.quantized, memory=memory,
        max_num_batched_tokens=facts.max_num_batched_tokens)
    refusal = None if no_pipeline_reason else support.known_failure(
        facts.pp, facts.speculative, facts.async_scheduling,
        facts.num_layers or num_hidden_layers(facts.model), partition.layers)
    stand_aside = no_pipeline_reason or (
        "vLLM runs this model on its V1 runner" if not facts.v2_runner else
        support.unproven_reason(facts.speculative, facts.kv_connector, settings.allow_unproven))
    blocker = None
    if settings.direct_handoff and facts.pp <= 1:
        blocker = "no pipeline parallelism"
    elif settings.direct_handoff and facts.speculative is not None:
        blocker = "speculative decoding (its drafts change what a step hands on)"
    return EnginePlan(
        refusal=refusal, stand_aside=stand_aside, no_pipeline=no_pipeline_reason is not None,
        cadence=_cadence(settings, facts, stand_aside),
        asked_cadence=settings.decode_cadence,
        direct_handoff=settings.direct_handoff and blocker is None and stand_aside is None,
        direct_handoff_blocker=blocker, layer_partition=settings.layer_partition,
        layers=partition.layers, split_decided=not partition.undecided, partition=partition)
