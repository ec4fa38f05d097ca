"""Preemption with output still in flight, under async scheduling and PP.

With pipeline parallelism, vLLM's async scheduler keeps up to ``pp_size + 1``
batches in flight and schedules a request again before its earlier output has
returned. When KV-cache pressure then preempts the request, vLLM 0.26 resets
its computed tokens but keeps the output placeholders of the frames still in
flight. If the request resumes before those frames return, the stale
placeholders make its resumed prefill look like a partial chunk, so that step
reserves no placeholder; the token it samples then drives the count below zero
and the engine core dies on ``assert request.num_output_placeholders >= 0``.
Stock vLLM crashes the same way (upstream reworked this in vLLM PR #48245).

The override turns the frames in flight at preemption into stale frames: vLLM's
own discard counter (which ``reset_prefix_cache`` already uses for the same
situation) drops their tokens when they return, and the placeholders start
from zero again. The dropped token is computed again once the request resumes,
so no output is lost or repeated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PreemptFn = Callable[[Any, Any, float], None]


def frames_in_flight(scheduler: Any, request: Any) -> int | None:
    """Output frames of ``request`` still in flight, or None if they cannot be counted.

    Without speculative decoding each frame carries exactly one sampled token,
    so the placeholders count the frames. With draft tokens a frame holds a
    varying number of placeholders; those requests keep vLLM's own handling.
    """
    if getattr(scheduler, "num_spec_tokens", 0) or getattr(
        scheduler, "num_sampled_tokens_per_step", 1
    ) != 1:
        return None
    return request.num_output_placeholders


def discarding_in_flight_output(original: PreemptFn) -> PreemptFn:
    """Wrap ``Scheduler._preempt_request`` so in-flight output becomes stale."""

    def _preempt_request(self: Any, request: Any, timestamp: float) -> None:
        in_flight = frames_in_flight(self, request)
        original(self, request, timestamp)
        if in_flight:
            request.async_tokens_to_discard += in_flight
            request.num_output_placeholders = 0

    _preempt_request.__wrapped__ = original  # type: ignore[attr-defined]
    return _preempt_request
