"""One engine's plan: every decision the plugin makes for an engine, made by
:func:`plan_engine` from the settings and the engine's facts, and held by what acts on it
(the engine core's scheduler, each worker's runner; ``check`` and ``plan`` print it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.shared import support
from vllm_pp_cudagraph.shared import layer_partition
from vllm_pp_cudagraph.shared.stage_costs import num_hidden_layers
from vllm_pp_cudagraph.shared.settings import (
    DecodeCadence,
    LayerPartition,
    PPCudaGraphSettings,
    hand_set_partition,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class EngineFacts:
    """What a plan reads of an engine: taken from a starting engine's ``VllmConfig`` by
    :meth:`of`, or described by ``check`` and ``plan`` for an engine not started."""

    pp: int
    #: The model's Hugging Face config (object or dict), for the split's costs.
    model: Any
    max_num_seqs: int
    max_num_batched_tokens: int | None = None
    num_layers: int | None = None  # vLLM's count, where it differs from the config's
    dtype_bytes: int | None = None
    quantized: bool = False
    gpu_memory_utilization: float = layer_partition.DEFAULT_GPU_MEMORY_UTILIZATION
    kv_cache_memory_bytes: int | None = None
    v2_runner: bool = True  # whether vLLM builds MRV2 (it does on a GPU)
    #: Whether the engine core runs the plugin's scheduler (vLLM's async one, with the cadence).
    cadence_scheduler: bool = True
    async_scheduling: bool | None = True
    speculative: str | None = None  # the drafting method; "" where vLLM names none
    kv_connector: str | None = None  # "" where a KV transfer config names no connector

    @classmethod
    def of(cls, vllm_config: VllmConfig) -> EngineFacts:
        """The facts of the engine ``vllm_config`` configures."""
        model, cache = vllm_config.model_config, vllm_config.cache_config
        scheduler = vllm_config.scheduler_config
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
            cadence_scheduler=_qualname(scheduler.get_scheduler_cls()) == PLUGIN_SCHEDULER,
            async_scheduling=getattr(scheduler, "async_scheduling", None),
            speculative=None if drafts is None else str(getattr(drafts, "method", "") or ""),
            kv_connector=None if transfer is None else str(
                getattr(transfer, "kv_connector", "") or ""))


#: The scheduler class the API server names for a PP engine on vLLM's async scheduler.
PLUGIN_SCHEDULER = "vllm_pp_cudagraph.engine_core.decode_cadence.PPCadenceScheduler"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: Cadences that may let a request decode sooner than vLLM's (``balance`` only delays).
LIFTING = frozenset({DecodeCadence.AUTO, DecodeCadence.MERGE, DecodeCadence.FILL})


@dataclass(frozen=True)
class EnginePlan:
    """What the plugin does for one engine. Every process of the engine computes the same
    plan from the same inputs; the layer split under ``auto`` needs the GPU's memory, which
    only a worker reads (``split_decided`` says whether this plan had it)."""

    #: Why stock vLLM of this release fails this engine, and what to change.
    refusal: str | None
    #: Why the workers run vLLM's own runner; None where they run the plugin's.
    stand_aside: str | None
    no_pipeline: bool
    #: The decode cadence the engine core's scheduler runs.
    cadence: DecodeCadence
    asked_cadence: DecodeCadence
    direct_handoff: bool
    direct_handoff_blocker: str | None
    layer_partition: LayerPartition
    #: Layers per stage, where known (vLLM's split under the default is known only to vLLM).
    layers: tuple[int, ...] | None
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


def _stand_aside(settings: PPCudaGraphSettings, facts: EngineFacts) -> str | None:
    if reason := support.no_pipeline_reason(facts.pp):
        return reason
    if not facts.v2_runner:
        return "vLLM runs this model on its V1 runner"
    return support.unproven_reason(facts.speculative, facts.kv_connector,
                                   settings.allow_unproven)


def _cadence(settings: PPCudaGraphSettings, facts: EngineFacts, stand_aside: str | None
             ) -> DecodeCadence:
    """``settings.decode_cadence`` where vLLM's MRV2 PP cadence exists to change and the
    plugin's scheduler runs it (not beside a scheduler class of the user's own). Not with
    speculative decoding (its rejected drafts reach the first stages through the same
    ring, unmeasured with consecutive decodes) nor a KV connector (its requests wait on
    transfers the cadence does not see)."""
    if (stand_aside or facts.speculative is not None or facts.kv_connector is not None
            or not facts.cadence_scheduler):
        return DecodeCadence.VLLM
    return settings.decode_cadence


def _handoff_blocker(facts: EngineFacts) -> str | None:
    if facts.pp <= 1:
        return "no pipeline parallelism"
    if facts.speculative is not None:
        return "speculative decoding (its drafts change what a step hands on)"
    return None


def plan_engine(settings: PPCudaGraphSettings, facts: EngineFacts,
                gpu_memory_bytes: int | None = None) -> EnginePlan:
    """The plan for the engine of ``facts`` under ``settings`` and the process's hand-set
    split (``hand_set_partition()``, vLLM's variable); ``gpu_memory_bytes`` is the GPU's (a
    worker's, or the one ``check`` and ``plan`` are told of), which the ``auto`` layer split
    needs."""
    no_pipeline = support.no_pipeline_reason(facts.pp) is not None
    memory = layer_partition.Memory(
        gpu_memory_bytes if facts.kv_cache_memory_bytes is None else None,
        facts.gpu_memory_utilization, facts.kv_cache_memory_bytes)
    partition = layer_partition.decide(
        settings.layer_partition, facts.model, facts.pp, facts.max_num_seqs,
        hand_set_partition(), num_layers=facts.num_layers, dtype_bytes=facts.dtype_bytes,
        quantized=facts.quantized, memory=memory,
        max_num_batched_tokens=facts.max_num_batched_tokens)
    refusal = None if no_pipeline else support.known_failure(
        facts.pp, facts.speculative, facts.async_scheduling,
        facts.num_layers or num_hidden_layers(facts.model), partition.layers)
    stand_aside = _stand_aside(settings, facts)
    blocker = _handoff_blocker(facts) if settings.direct_handoff else None
    return EnginePlan(
        refusal=refusal, stand_aside=stand_aside, no_pipeline=no_pipeline,
        cadence=_cadence(settings, facts, stand_aside),
        asked_cadence=settings.decode_cadence,
        direct_handoff=settings.direct_handoff and blocker is None and stand_aside is None,
        direct_handoff_blocker=blocker, layer_partition=settings.layer_partition,
        layers=partition.layers, split_decided=not partition.undecided, partition=partition)
