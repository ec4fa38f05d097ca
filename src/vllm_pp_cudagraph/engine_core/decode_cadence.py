"""The scheduler half of the decode cadence: which steps a request decodes in under PP.

``merge`` lets every running request decode at every step, ``balance`` evens the
``pp_size`` decode groups, ``fill`` gives a step that would be empty the group that can go
first, ``auto`` measures vLLM's own cadence, ``balance`` and ``merge`` and leaves vLLM's
only for one that beats it (cadence_policy.py). The worker half is first_stage_tokens.py;
docs/architecture.md says why both are safe."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.sched.interface import PauseState

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.engine_core.cadence_policy import STOCK, CadenceChooser
from vllm_pp_cudagraph.shared.engine_plan import engine_core_plan
from vllm_pp_cudagraph.engine_core.engine_record import EngineRecord
from vllm_pp_cudagraph.shared.settings import DecodeCadence, PPCudaGraphSettings

ScheduleFn = Callable[..., Any]

#: What the hook keeps per scheduler (:class:`_SchedulerState`), beside vLLM's object
#: rather than on it.
_STATES: weakref.WeakKeyDictionary[Any, _SchedulerState] = weakref.WeakKeyDictionary()


def scheduler_state(scheduler: Any) -> _SchedulerState | None:
    """What the hook keeps for ``scheduler``; None before its first step under the hook."""
    return _STATES.get(scheduler)


def may_lift(request: Any) -> bool:
    """Whether ``request`` may decode sooner than vLLM's cadence lets it: not under
    structured output, nor when the outputs in flight already reach ``max_tokens``."""
    return not request.use_structured_output and (
        request.num_output_tokens + request.num_output_placeholders < request.max_tokens)


def lift_idle_cadence(running: Iterable[Any], step: int) -> int:
    """Let the soonest-eligible group decode at ``step`` if no request may; return its size
    (``step``: the ``current_step`` this ``schedule()`` call will have)."""
    held = []
    for request in running:  # one pass over the running requests, every step
        if request.next_decode_eligible_step <= step:
            return 0
        if may_lift(request):
            held.append(request)
    if not held:
        return 0
    soonest = min(r.next_decode_eligible_step for r in held)
    lifted = [r for r in held if r.next_decode_eligible_step == soonest]
    for request in lifted:
        request.next_decode_eligible_step = step
    return len(lifted)


def merge_decode_groups(running: Iterable[Any], step: int) -> int:
    """Let every held request that :func:`may_lift` decode at ``step``; return how many."""
    lifted = [r for r in running if r.next_decode_eligible_step > step and may_lift(r)]
    for request in lifted:
        request.next_decode_eligible_step = step
    return len(lifted)


def is_decoding(request: Any) -> bool:
    """Whether ``request`` has a token out or in flight and no prompt chunk left."""
    return not request.is_prefill_chunk and (
        request.num_output_tokens + request.num_output_placeholders > 0)


def balance_decode_groups(running: Iterable[Any], step: int, pp_size: int) -> int:
    """Delay requests so ``step`` decodes about a ``pp_size``-th of them; return how many
    (the newest eligible ones beyond that move to ``step + 1``)."""
    decoding = [r for r in running if is_decoding(r)]
    eligible = [r for r in decoding if r.next_decode_eligible_step <= step]
    excess = len(eligible) - math.ceil(len(decoding) / pp_size)
    if excess <= 0:
        return 0
    movable = [r for r in eligible if not r.use_structured_output][-excess:]
    for request in movable:
        request.next_decode_eligible_step = step + 1
    return len(movable)


def decode_phases(running: Iterable[Any], pp_size: int) -> dict[str, int]:
    """Each running request's decode group: its next eligible step modulo ``pp_size``."""
    return {r.request_id: r.next_decode_eligible_step % pp_size for r in running}


def restore_decode_phases(running: Iterable[Any], phases: dict[str, int], pp_size: int) -> None:
    """Delay each request in ``phases`` to the next step of its recorded group (never
    sooner; structured outputs are left alone)."""
    for request in running:
        phase = phases.get(request.request_id)
        if phase is not None and not request.use_structured_output:
            delay = (phase - request.next_decode_eligible_step) % pp_size
            request.next_decode_eligible_step += delay


def may_admit(scheduler: Any) -> bool:
    """Whether this step could admit a waiting request, as ``Scheduler.schedule`` checks it.

    KV-cache space is not checked: a step that then admits nothing stays idle,
    as in vLLM.
    """
    if not any(vllm_surface.waiting_queues(scheduler)):
        return False
    if getattr(scheduler, "_pause_state", None) not in (None, PauseState.UNPAUSED):
        return False
    occupied = len(scheduler.running) + getattr(scheduler, "num_waiting_for_streaming_input", 0)
    return occupied < vllm_surface.admission_cap(scheduler)


def decode_tokens(output: Any) -> int:
    """Requests a scheduler output decodes one token for (without draft tokens: 1 each)."""
    return sum(1 for n in output.num_scheduled_tokens.values() if n == 1)


def wrap_schedule(original: ScheduleFn, settings: PPCudaGraphSettings) -> ScheduleFn:
    """Wrap the async scheduler's ``schedule`` to run the cadence of its engine's plan;
    under ``auto`` each scheduler gets its own :class:`CadenceChooser`, fed every step."""

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        state = _STATES.get(self)
        if state is None:
            state = _STATES[self] = _SchedulerState.of(self, settings)
        if state.cadence is DecodeCadence.VLLM:
            return original(self, *args, **kwargs)
        chooser = state.chooser
        policy = chooser.cadence if chooser is not None else state.cadence
        step = self.current_step + 1
        if chooser is not None:
            state.keep_vllms_groups(chooser, self.running, self.pp_size)
        if policy is DecodeCadence.MERGE:
            merge_decode_groups(self.running, step)
        elif policy is DecodeCadence.BALANCE:
            balance_decode_groups(self.running, step, self.pp_size)
        elif policy is DecodeCadence.FILL and not may_admit(self):
            lift_idle_cadence(self.running, step)
        output = original(self, *args, **kwargs)
        if chooser is not None:
            chooser.record_step(decode_tokens(output), sum(1 for r in self.running if is_decoding(r)))
        if state.record is not None:
            state.record.step(self.running, str(policy), chooser)
        return output

    schedule.__wrapped__ = original  # type: ignore[attr-defined]
    return schedule


@dataclass
class _SchedulerState:
    """What the hook keeps per scheduler: its plan's cadence, the ``auto`` chooser, and
    the engine's metrics record."""

    cadence: DecodeCadence
    chooser: CadenceChooser | None
    record: EngineRecord | None
    #: Each request's decode group under vLLM's cadence while ``auto`` tries another.
    vllm_phases: dict[str, int] | None = None

    def keep_vllms_groups(self, chooser: CadenceChooser, running: list, pp_size: int) -> None:
        """Let a trial leave no trace on vLLM's cadence: vLLM's cadence keeps whatever
        groups it is given, so a trial that merged or evened them would otherwise decide
        what vLLM's cadence measures next. The groups are recorded as a trial from it
        starts and restored as it goes back to vLLM's cadence."""
        on_stock = chooser.incumbent is STOCK
        if on_stock and chooser.cadence is not STOCK and self.vllm_phases is None:
            self.vllm_phases = decode_phases(running, pp_size)
        elif chooser.cadence is STOCK and self.vllm_phases is not None:
            restore_decode_phases(running, self.vllm_phases, pp_size)
            self.vllm_phases = None
        elif not on_stock:
            self.vllm_phases = None

    @classmethod
    def of(cls, scheduler: Any, settings: PPCudaGraphSettings) -> _SchedulerState:
        plan = engine_core_plan(settings, scheduler.vllm_config)
        chooser = CadenceChooser(scheduler.pp_size) if plan.cadence is DecodeCadence.AUTO else None
        record = None
        if settings.metrics and plan.cadence is not DecodeCadence.VLLM:
            parallel = scheduler.vllm_config.parallel_config
            record = EngineRecord(
                engine=getattr(parallel, "data_parallel_rank", 0), pp_size=scheduler.pp_size,
                asked_cadence=str(plan.asked_cadence),
                layer_split=(plan.layers or ()) if plan.split_decided else (),
                split_reason=plan.partition.why if plan.split_decided else
                "auto: each worker decides from its GPU's memory")
        return cls(plan.cadence, chooser, record)
