"""The scheduler half of the PP decode cadence (worker half: first_stage_tokens.py; why both are
safe: docs/architecture.md). ``merge`` decodes every request every step, ``balance`` evens the
decode groups, ``fill`` gives a would-be empty step the group due first, ``auto`` measures."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.engine_core.cadence_policy import STOCK, CadenceChooser
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, plan_engine
from vllm_pp_cudagraph.engine_core.engine_record import EngineRecord
from vllm_pp_cudagraph.shared.settings import DecodeCadence, PPCudaGraphSettings


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


def may_admit(scheduler: Any) -> bool:
    """Whether this step could admit a waiting request, as ``Scheduler.schedule`` checks it
    (not KV-cache space: a step that then admits nothing stays idle, as in vLLM)."""
    if (not any(vllm_surface.waiting_queues(scheduler))
            or getattr(scheduler, "_pause_state", None) not in (None, PauseState.UNPAUSED)):
        return False
    occupied = len(scheduler.running) + getattr(scheduler, "num_waiting_for_streaming_input", 0)
    return occupied < vllm_surface.admission_cap(scheduler)


class PPCadenceScheduler(AsyncScheduler):
    """vLLM's async scheduler with the engine's planned PP cadence (patches.py, scheduler-class)."""

    def __init__(self, *args: Any, settings: PPCudaGraphSettings | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = settings or PPCudaGraphSettings.current()
        facts = dataclasses.replace(EngineFacts.of(self.vllm_config), cadence_scheduler=True)
        self.plan = plan_engine(settings, facts)
        self.cadence: DecodeCadence = self.plan.cadence
        self.chooser: CadenceChooser | None = (
            CadenceChooser(self.pp_size) if self.cadence is DecodeCadence.AUTO else None)
        self.record: EngineRecord | None = None
        if settings.metrics and self.cadence is not DecodeCadence.VLLM:
            parallel, plan = self.vllm_config.parallel_config, self.plan
            self.record = EngineRecord(
                engine=getattr(parallel, "data_parallel_rank", 0), pp_size=self.pp_size,
                asked_cadence=str(plan.asked_cadence),
                layer_split=(plan.layers or ()) if plan.split_decided else (),
                split_reason=plan.partition.why if plan.split_decided else
                "auto: each worker decides from its GPU's memory")
        #: Each request's decode group under vLLM's cadence while ``auto`` tries another.
        self.vllm_phases: dict[str, int] | None = None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.cadence is DecodeCadence.VLLM:
            return super().schedule(*args, **kwargs)
        chooser = self.chooser
        policy = chooser.cadence if chooser is not None else self.cadence
        step = self.current_step + 1
        if chooser is not None:
            self._keep_vllms_groups(chooser)
        if policy is DecodeCadence.MERGE:
            merge_decode_groups(self.running, step)
        elif policy is DecodeCadence.BALANCE:
            balance_decode_groups(self.running, step, self.pp_size)
        elif policy is DecodeCadence.FILL and not may_admit(self):
            lift_idle_cadence(self.running, step)
        output = super().schedule(*args, **kwargs)
        if chooser is not None:  # decodes: requests scheduled one token (no draft tokens)
            chooser.record_step(sum(1 for n in output.num_scheduled_tokens.values() if n == 1),
                                sum(1 for r in self.running if is_decoding(r)))
        if self.record is not None:
            self.record.step(self.running, str(policy), chooser)
        return output

    def _keep_vllms_groups(self, chooser: CadenceChooser) -> None:
        """Let a trial leave no trace on vLLM's cadence, which keeps whatever groups it is given:
        record each request's group as one starts, and delay it back to that group as it ends."""
        on_stock = chooser.incumbent is STOCK
        if on_stock and chooser.cadence is not STOCK and self.vllm_phases is None:
            self.vllm_phases = {r.request_id: r.next_decode_eligible_step % self.pp_size
                                for r in self.running}
        elif chooser.cadence is STOCK and self.vllm_phases is not None:
            for request in self.running:
                phase = self.vllm_phases.get(request.request_id)
                if phase is not None and not request.use_structured_output:
                    request.next_decode_eligible_step += (
                        (phase - request.next_decode_eligible_step) % self.pp_size)
            self.vllm_phases = None
        elif not on_stock:
            self.vllm_phases = None
