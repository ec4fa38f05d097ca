"""Which engine steps a request decodes in under pipeline parallelism (the scheduler half).

With Model Runner V2 and PP, vLLM's async scheduler lets a request decode again
only ``pp_size`` steps after its last decode (``next_decode_eligible_step``).
The first stages follow the same ring: the tokens the last stage sampled at
step T are applied to a first stage's request state at step T + ``pp_size``
(``PPHandler``). Requests that arrive at different steps therefore form up to
``pp_size`` groups that take turns, one group per step; and when all running
requests decode together, as after a batch queued at once, every step between
two decodes is empty. Either way each request decodes once per ``pp_size``
steps, and when a step costs about the same whatever its batch (small models,
CUDA graphs, decode), throughput is a ``pp_size``-th of one batch per step.

Two halves change how often a request decodes without changing what any step
computes:

* Scheduler (:func:`changing_cadence`), by ``VLLM_PP_CUDAGRAPH_DECODE_CADENCE``:
  ``merge`` lets every running request decode at every step
  (:func:`merge_decode_groups`); ``balance`` delays requests by a step so the
  decoding requests take turns in ``pp_size`` groups of even size, one group
  per stage at a time (:func:`balance_decode_groups`); ``auto`` measures both
  as it serves and keeps the faster (cadence_policy.py); ``fill`` lets only
  steps that would be empty, with no room for a new request either, decode
  the group that would become eligible first (:func:`lift_idle_cadence`).
  Requests guided by structured output are never moved; requests complete
  with what is in flight are never lifted (:func:`may_lift`). Delaying a
  decode needs nothing from the workers: a first stage holds a request's
  newest token from the step it would have decoded at on.
* First stages (``first_stage_tokens.py``): before a step runs, every
  sampled-token entry still waiting in vLLM's ring that holds a request this
  step decodes is applied, oldest first, so a lifted request reads the token
  the last stage sampled at its previous step.

The worker half depends only on what a step schedules, so it is correct for
any schedule; the scheduler half is the policy. Lifting (``merge``, ``fill``,
``auto``) relies on the worker half; delaying (``balance``) does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from vllm.v1.core.sched.interface import PauseState

from vllm_pp_cudagraph import compat
from vllm_pp_cudagraph.cadence_policy import CadenceChooser
from vllm_pp_cudagraph.settings import DecodeCadence

ScheduleFn = Callable[..., Any]


def may_lift(request: Any) -> bool:
    """Whether ``request`` may decode sooner than vLLM's cadence lets it.

    Not when structured output guides it: the engine core builds a step's
    grammar bitmask after applying only the oldest batch in flight, and vLLM's
    cadence is what makes that batch hold the request's previous token. Not
    when the outputs already in flight complete it: vLLM's "already at
    max_tokens" skip assumes at most one output in flight, so a lifted request
    could be scheduled for tokens it will never emit.
    """
    if request.use_structured_output:
        return False
    in_flight = request.num_output_placeholders
    return request.num_output_tokens + in_flight < request.max_tokens


def lift_idle_cadence(running: Iterable[Any], step: int) -> int:
    """Let the soonest-eligible group decode at ``step`` if no request may; return its size.

    ``running`` are the scheduler's running requests, ``step`` the value
    ``current_step`` will have in this ``schedule()`` call. If any running
    request is already eligible (or there is none), nothing changes.
    Otherwise, of the requests that :func:`may_lift`, those with the smallest
    ``next_decode_eligible_step`` become eligible now. Lifting only that group
    keeps other groups where they are, so with ``pp_size > 2`` groups still
    fill different steps.
    """
    held = []
    for request in running:
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
    """Let every held request that :func:`may_lift` decode at ``step``; return how many.

    Requests that arrive while others decode form groups of their own, and
    vLLM's cadence keeps each group ``pp_size`` steps apart for as long as it
    runs. Merging them makes every running request decode at every step, as
    one batch does when all its requests arrive together.
    """
    lifted = 0
    for request in running:
        if request.next_decode_eligible_step > step and may_lift(request):
            request.next_decode_eligible_step = step
            lifted += 1
    return lifted


def is_decoding(request: Any) -> bool:
    """Whether ``request`` has a token out or in flight and no prompt chunk left."""
    if request.is_prefill_chunk:
        return False
    return request.num_output_tokens + request.num_output_placeholders > 0


def balance_decode_groups(running: Iterable[Any], step: int, pp_size: int) -> int:
    """Delay requests so ``step`` decodes about a ``pp_size``-th of them; return how many.

    Of the decoding requests eligible at ``step``, those beyond
    ``ceil(decoding / pp_size)`` move to ``step + 1``, newest first, where the
    same rule applies: one lone group (everything arrived at once) splits into
    ``pp_size`` even groups over the next steps, and lopsided groups even out.
    Nothing is ever made eligible sooner. Structured-output requests are not
    moved (their grammar follows vLLM's cadence), but count in their group.
    """
    decoding = [r for r in running if is_decoding(r)]
    eligible = [r for r in decoding if r.next_decode_eligible_step <= step]
    excess = len(eligible) - math.ceil(len(decoding) / pp_size)
    if excess <= 0:
        return 0
    movable = [r for r in eligible if not r.use_structured_output][-excess:]
    for request in movable:
        request.next_decode_eligible_step = step + 1
    return len(movable)


def lifts_decodes(cadence: DecodeCadence) -> bool:
    """Whether ``cadence`` may let a request decode sooner than vLLM's cadence.

    Such a schedule is right only where every worker runs the plugin's runner
    (first_stage_tokens.py); ``balance`` only ever delays.
    """
    return cadence in (DecodeCadence.AUTO, DecodeCadence.MERGE, DecodeCadence.FILL)


def cadence_in_effect(
    cadence: DecodeCadence, pp_size: int, use_v2_model_runner: bool, num_spec_tokens: int,
    kv_connector: bool = False,
) -> DecodeCadence:
    """The cadence a scheduler set up so runs: ``cadence`` where vLLM's MRV2 PP cadence
    exists to change, else ``vllm``.

    Speculative decoding is left alone: its rejected draft tokens are applied
    to the first stages' state through the same ring, and that path has not
    been measured with consecutive decodes. So are engines with a KV connector,
    whose requests wait on transfers the cadence does not see. The scheduler hook asks this with
    the scheduler's own settings (:func:`scheduler_cadence`), the engine core's
    worker check with the config's (:func:`config_cadence`).
    """
    if pp_size <= 1 or not use_v2_model_runner or num_spec_tokens or kv_connector:
        return DecodeCadence.VLLM
    return cadence


def scheduler_cadence(scheduler: Any, cadence: DecodeCadence) -> DecodeCadence:
    """:func:`cadence_in_effect` for a built scheduler."""
    return cadence_in_effect(
        cadence,
        getattr(scheduler, "pp_size", 1),
        bool(getattr(scheduler, "use_v2_model_runner", False)),
        getattr(scheduler, "num_spec_tokens", 0),
        getattr(scheduler, "connector", None) is not None,
    )


def config_cadence(vllm_config: Any, cadence: DecodeCadence) -> DecodeCadence:
    """:func:`cadence_in_effect` for the scheduler ``vllm_config`` will build."""
    speculative = vllm_config.speculative_config
    return cadence_in_effect(
        cadence,
        vllm_config.parallel_config.pipeline_parallel_size,
        bool(vllm_config.use_v2_model_runner),
        (getattr(speculative, "num_speculative_tokens", None) or 0) if speculative else 0,
        getattr(vllm_config, "kv_transfer_config", None) is not None,
    )


def may_admit(scheduler: Any) -> bool:
    """Whether this step could admit a waiting request, as ``Scheduler.schedule`` checks it.

    KV-cache space is not checked: a step that then admits nothing stays idle,
    as in vLLM.
    """
    if not any(compat.waiting_queues(scheduler)):
        return False
    if getattr(scheduler, "_pause_state", None) not in (None, PauseState.UNPAUSED):
        return False
    occupied = len(scheduler.running) + getattr(scheduler, "num_waiting_for_streaming_input", 0)
    return occupied < compat.admission_cap(scheduler)


def decode_tokens(output: Any) -> int:
    """Requests a scheduler output decodes one token for (without draft tokens: 1 each)."""
    return sum(1 for n in output.num_scheduled_tokens.values() if n == 1)


def changing_cadence(original: ScheduleFn, cadence: DecodeCadence) -> ScheduleFn:
    """Wrap ``Scheduler.schedule`` for the async scheduler with ``cadence`` (module docstring).

    Under ``auto`` each scheduler gets its own :class:`CadenceChooser`, fed
    every step.
    """

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        policy = scheduler_cadence(self, cadence)
        if policy is DecodeCadence.VLLM:
            return original(self, *args, **kwargs)
        chooser = None
        if policy is DecodeCadence.AUTO:
            chooser = self.__dict__.get("_pp_cudagraph_chooser")
            if chooser is None:
                chooser = self._pp_cudagraph_chooser = CadenceChooser(self.pp_size)
            policy = chooser.cadence
        step = self.current_step + 1
        if policy is DecodeCadence.MERGE:
            merge_decode_groups(self.running, step)
        elif policy is DecodeCadence.BALANCE:
            balance_decode_groups(self.running, step, self.pp_size)
        elif policy is DecodeCadence.FILL and not may_admit(self):
            lift_idle_cadence(self.running, step)
        output = original(self, *args, **kwargs)
        if chooser is not None:
            chooser.record_step(decode_tokens(output), sum(1 for r in self.running if is_decoding(r)))
        return output

    schedule.__wrapped__ = original  # type: ignore[attr-defined]
    return schedule
