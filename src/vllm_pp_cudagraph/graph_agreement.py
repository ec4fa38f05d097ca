"""Pipeline stages agree on which CUDA graphs exist, once, after capture.

Every stage dispatches each step from the same scheduler output, and dispatch
is a pure lookup in the manager's table of captured descriptors. So if all
stages hold the same table, they pick the same graph mode and padded size on
every step with no per-step communication. This module makes the tables equal:
after capture, each stage reports what it captured (or that capture failed),
and all stages keep only what every stage has. If any stage failed, or nothing
is common, every stage runs eagerly, together, instead of one stage replaying
while its peer cannot (vLLM issue #45094: the pipeline hangs).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CaptureOutcome:
    """What one pipeline stage ended capture with."""

    stage: int
    descriptors: frozenset[Hashable] = field(default_factory=frozenset)
    error: str | None = None


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
        return Agreement(
            frozenset(), local, f"CUDA-graph capture failed ({detail}); all stages run eagerly"
        )
    common = frozenset.intersection(*(o.descriptors for o in outcomes))
    if common == local and all(o.descriptors == common for o in outcomes):
        return Agreement(common, frozenset(), None)
    sizes = ", ".join(f"stage {o.stage}: {len(o.descriptors)}" for o in outcomes)
    reason = (
        f"stages captured different graphs ({sizes}); keeping the {len(common)} "
        "common to all. Different stages may have resolved different cudagraph "
        "modes for their attention backends: set compilation_config.cudagraph_mode "
        "explicitly to a mode every stage supports."
    )
    return Agreement(common, local - common, reason)
