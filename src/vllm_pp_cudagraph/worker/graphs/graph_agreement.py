"""Pipeline stages agree, once after capture, on which CUDA graphs exist (vLLM issue #45094)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CaptureOutcome:
    """What one pipeline stage ended capture with."""

    stage: int
    descriptors: frozenset[Hashable] = field(default_factory=frozenset)
    error: str | None = None


CAPTURE_FAILED_ADVICE = (
    "To keep CUDA graphs, give capture more room (lower gpu_memory_utilization, or "
    "fewer or smaller compilation_config.cudagraph_capture_sizes), or set "
    "enforce_eager=True to skip capture")


def merge_tp_peers(outcomes: Sequence[CaptureOutcome]) -> CaptureOutcome:
    """One stage's outcome from its TP peers': the graphs all captured, every failure named."""
    if len(outcomes) == 1:
        return outcomes[0]
    errors = [f"TP rank {rank}: {o.error}" for rank, o in enumerate(outcomes) if o.error]
    common = frozenset.intersection(*(o.descriptors for o in outcomes))
    return CaptureOutcome(outcomes[0].stage, frozenset() if errors else common,
                          "; ".join(errors) or None)


@dataclass(frozen=True)
class Agreement:
    """The descriptors every stage keeps, and why others were dropped."""

    keep: frozenset[Hashable]
    dropped: frozenset[Hashable]
    reason: str | None

    @property
    def all_eager(self) -> bool:
        return not self.keep


def agree(outcomes: Sequence[CaptureOutcome], local_stage: int) -> Agreement:
    """Decide, identically on every stage, which descriptors survive."""
    local = next(o for o in outcomes if o.stage == local_stage).descriptors
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        detail = "; ".join(f"stage {o.stage}: {o.error}" for o in failed)
        return Agreement(frozenset(), local, f"CUDA-graph capture failed ({detail}); every "
                         f"stage runs eagerly. {CAPTURE_FAILED_ADVICE}.")
    common = frozenset.intersection(*(o.descriptors for o in outcomes))
    if common == local and all(o.descriptors == common for o in outcomes):
        return Agreement(common, frozenset(), None)
    sizes = ", ".join(f"stage {o.stage}: {len(o.descriptors)}" for o in outcomes)
    return Agreement(common, local - common,
                     f"stages captured different graphs ({sizes}); keeping the {len(common)} "
                     "common to all. Different stages may have resolved different cudagraph "
                     "modes for their attention backends: set compilation_config.cudagraph_mode "
                     "explicitly to a mode every stage supports.")
