"""Preemption with output in flight under async scheduling and PP (vLLM 0.26; PR #48245)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

UpdateFn = Callable[[Any, Any], None]


def frames_in_flight(scheduler: Any, request: Any) -> int | None:
    """Output frames of ``request`` still in flight, or None if they cannot be counted
    (with draft tokens, whose frames hold varying numbers of placeholders)."""
    drafts = getattr(scheduler, "num_spec_tokens", 0)
    if drafts or getattr(scheduler, "num_sampled_tokens_per_step", 1) != 1:
        return None
    return request.num_output_placeholders


def restarted_request_ids(scheduler_output: Any) -> list[str]:
    """Requests this step starts from scratch: new ones and resumed ones (MRV2 sends
    resumed ones as new; V1 flags them in ``resumed_req_ids``)."""
    ids = [data.req_id for data in scheduler_output.scheduled_new_reqs]
    return ids + list(scheduler_output.scheduled_cached_reqs.resumed_req_ids)


def wrap_update_after_schedule(original: UpdateFn) -> UpdateFn:
    """Wrap ``AsyncScheduler._update_after_schedule``: a restarted request's in-flight
    placeholders become tokens to discard."""

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
