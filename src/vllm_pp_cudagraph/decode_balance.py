"""Even decode groups over Model Runner V2's pipeline cadence.

With pipeline parallelism and async scheduling, vLLM's scheduler lets a request
decode again only ``pp_size`` steps after its last decode
(``Request.next_decode_eligible_step``). The workers rely on that gap: a
non-last stage learns a request's sampled token from a broadcast it consumes
``pp_size`` steps later. Requests thereby fall into ``pp_size`` groups, one per
step of the cycle. Requests that start together land in the same group, so with
all of them in one group every other step (at PP=2) has nothing to run, and the
pipeline carries one batch at a time.

:func:`rebalance_decode_slots` runs after each schedule. It moves the newest of
this step's decodes forward by up to ``pp_size - 1`` steps, into groups with
fewer requests, until no group holds more than its share. A request is only
ever delayed, never brought forward, so the workers' gap of at least
``pp_size`` steps holds.
"""

from __future__ import annotations

from typing import Any


def rebalance_decode_slots(scheduler: Any, scheduler_output: Any) -> int:
    """Even out this step's decode group; return how many requests moved.

    ``scheduler`` is vLLM's ``AsyncScheduler`` right after
    ``_update_after_schedule`` of the step in ``scheduler_output``.
    """
    pp_size = scheduler.pp_size
    if pp_size <= 1 or not scheduler.use_v2_model_runner:
        return 0
    step = scheduler.current_step
    this_group = step % pp_size
    fresh = [
        request
        for req_id in scheduler_output.num_scheduled_tokens
        if (request := scheduler.requests.get(req_id)) is not None
        and not request.is_prefill_chunk
        and request.next_decode_eligible_step == step + pp_size
    ]
    if not fresh:
        return 0
    sizes = [0] * pp_size
    for request in scheduler.running:
        if not request.is_prefill_chunk:
            # Requests already eligible go at the next step.
            sizes[max(request.next_decode_eligible_step, step + 1) % pp_size] += 1
    share = -(-sum(sizes) // pp_size)
    moved = 0
    for delay in range(1, pp_size):
        group = (step + delay) % pp_size
        while sizes[this_group] > share and sizes[group] < share and moved < len(fresh):
            moved += 1
            fresh[-moved].next_decode_eligible_step += delay
            sizes[this_group] -= 1
            sizes[group] += 1
    return moved
