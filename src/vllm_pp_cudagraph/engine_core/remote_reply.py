"""A remote reader's ``MessageQueue.dequeue`` ignores ``shutting_down``, so a dead worker on another
node stalls the engine for ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``; this wait ends at shutdown."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: Seconds one poll of a remote reader's socket waits before the shutdown flag is rechecked.
POLL_SLICE_S = 0.5

CANCELLED = ("stopped waiting for a worker's reply from another node: the executor shut down "
             "(a worker died or the engine is stopping; the executor's error is logged above)")


def wrap_dequeue(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``MessageQueue.dequeue``: a remote reader's wait ends at shutdown."""
    def dequeue(self: Any, timeout: float | None = None, indefinite: bool = False) -> Any:
        # By name with defaults: a vLLM that renamed them keeps its dequeue (vllm_surface flags it).
        if not getattr(self, "_is_remote_reader", False) or getattr(self, "_is_local_reader", True):
            return original(self, timeout, indefinite)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if getattr(self, "shutting_down", False):
                raise RuntimeError(CANCELLED)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wait = POLL_SLICE_S if left is None else min(POLL_SLICE_S, left)
            if self.remote_socket.poll(timeout=int(wait * 1000)):
                return original(self, left, indefinite)
            if left is not None and left <= wait:
                raise TimeoutError

    dequeue.__wrapped__ = original  # type: ignore[attr-defined]
    return dequeue
