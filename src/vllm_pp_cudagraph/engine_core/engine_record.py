"""One engine's cadence, its switches and decode groups, as :class:`EngineSnapshot` files."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.shared.snapshots import KEPT_SWITCHES, EngineSnapshot, write_snapshot
from vllm_pp_cudagraph.shared.snapshots import INTERVAL_S

if TYPE_CHECKING:
    from vllm_pp_cudagraph.engine_core.cadence_policy import CadenceChooser, Verdict


def group_sizes(running: Iterable[Any], pp_size: int) -> tuple[int, ...]:
    """Running requests per decode group: those that may decode at the same steps."""
    sizes = [0] * pp_size
    for request in running:
        sizes[getattr(request, "next_decode_eligible_step", 0) % pp_size] += 1
    return tuple(sizes)


@dataclass
class EngineRecord:
    """Writes one engine's snapshot at most every :data:`INTERVAL_S` seconds."""
    engine: int
    pp_size: int
    asked_cadence: str
    layer_split: tuple[int, ...]
    split_reason: str
    _last: float | None = None

    def step(self, running: list, cadence: str, chooser: CadenceChooser | None) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < INTERVAL_S:
            return
        self._last = now
        switches = chooser.switches if chooser is not None else []
        write_snapshot(EngineSnapshot(
            engine=self.engine, time=time.time(), pp_size=self.pp_size, cadence=cadence,
            asked_cadence=self.asked_cadence, cadence_switches_total=len(switches),
            last_switch_reason=_reason(switches[-1]) if switches else None,
            cadence_trials_total=sum(chooser.trials.values()) if chooser else 0,
            cadence_trial_steps_total=sum(chooser.trial_steps.values()) if chooser else 0,
            cadence_wide_losses_total=sum(chooser.wide_losses.values()) if chooser else 0,
            cadences_adopted=tuple(str(s[1]) for s in switches[-KEPT_SWITCHES:]),
            recent_trials=tuple(map(trial_record, chooser.verdicts)) if chooser else (),
            group_sizes=group_sizes(running, self.pp_size), running_reqs=len(running),
            layer_split=self.layer_split, split_reason=self.split_reason))


def trial_record(verdict: Verdict) -> dict[str, Any]:
    """One trial's verdict as the engine's record keeps it (times in ms per token)."""
    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(1e3 * seconds, 2)
    return {"step": verdict.step, "cadence": str(verdict.cadence),
            "ms_per_token": ms(verdict.interval), "against_ms": ms(verdict.against),
            "decoding": round(verdict.decoders), "outcome": verdict.outcome}


def _reason(switch: tuple) -> str:
    step, adopted, interval, other, decoders = switch
    return (f"step {step}: {adopted} at {1e3 * interval:.2f} ms per token against "
            f"{1e3 * other:.2f}, {decoders:.0f} requests decoding")
