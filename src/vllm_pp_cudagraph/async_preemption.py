"""Preemption with output still in flight, under async scheduling and PP.

With pipeline parallelism, vLLM's async scheduler keeps up to ``pp_size + 1``
batches in flight and schedules a request again before its earlier output has
returned. When KV-cache pressure preempts such a request, vLLM 0.26 resets its
computed tokens but keeps the output placeholders of the frames still in
flight. If the request resumes before those frames return, the stale
placeholders make its resumed prefill look like a partial chunk: that step
reserves no placeholder, a stale frame then appends a token the resumed prefill
did not see, and the resumed step's own token either repeats a position or
drives the count below zero, so the engine core dies on
``assert request.num_output_placeholders >= 0``. Stock vLLM does both (upstream
reworked this in vLLM PR #48245).

The override acts when a preempted request is scheduled again. Placeholders it
still holds then belong to frames from before the preemption. They become
stale frames: vLLM's own discard counter, which ``reset_prefix_cache`` uses for
the same situation, drops their tokens when they return, and the resumed
prefill is scheduled as complete. Each dropped token is computed again by the
resumed request, so no output is lost or repeated. Frames that returned before
the resume are untouched: their tokens were appended and the resumed prefill
covers them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

UpdateFn = Callable[[Any, Any], None]


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


def restarted_request_ids(scheduler_output: Any) -> list[str]:
    """Requests this step starts from scratch: new ones and resumed ones.

    With Model Runner V2, vLLM sends resumed requests as new ones; with V1,
    as cached ones flagged in ``resumed_req_ids``.
    """
    ids = [data.req_id for data in scheduler_output.scheduled_new_reqs]
    return ids + list(scheduler_output.scheduled_cached_reqs.resumed_req_ids)


def dropping_stale_output_on_resume(original: UpdateFn) -> UpdateFn:
    """Wrap ``AsyncScheduler._update_after_schedule`` as described above."""

    def _update_after_schedule(self: Any, scheduler_output: Any) -> None:
        for req_id in restarted_request_ids(scheduler_output):
            request = self.requests[req_id]
            stale = frames_in_flight(self, request)
            if stale:
                request.async_tokens_to_discard += stale
                request.num_output_placeholders = 0
        original(self, scheduler_output)

    _update_after_schedule.__wrapped__ = original  # type: ignore[attr-defined]
    return _update_after_schedule
