"""A reply awaited from a worker on another node ends when the executor shuts down.

vLLM's executors read each worker's reply from a ``MessageQueue``. A worker on the
engine core's node answers through shared memory, whose reader wakes when the queue
is shut down; a worker on another node answers through a zmq socket, which
``MessageQueue.dequeue`` polls with no deadline of its own and no look at
``shutting_down``. When a worker on the second node dies, the executor's monitor
shuts the queues down and reports the failure, but the engine core's step is still
waiting for that worker's reply and the failure is handled only between steps: the
server keeps its requests and serves nothing until
``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` (300 s) pass.

The wrapper polls a remote reader's socket in short slices and, once the queue is
shut down, raises as a shared-memory reader does. A reply that arrives is read by
vLLM's own ``dequeue``, unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

DequeueFn = Callable[..., Any]

#: How long one poll of a remote reader's socket waits before the shutdown flag is
#: looked at again; a reply that arrives ends the poll at once.
POLL_SLICE_S = 0.5

CANCELLED = (
    "stopped waiting for a worker's reply from another node: the executor shut down "
    "(a worker died or the engine is stopping; the executor's error is logged above)"
)


def wrap_dequeue(original: DequeueFn) -> DequeueFn:
    """Wrap ``MessageQueue.dequeue``: a remote reader's wait ends at shutdown."""

    def dequeue(self: Any, timeout: float | None = None, indefinite: bool = False) -> Any:
        # Read by name with defaults: a vLLM that renamed them keeps its own dequeue (the
        # surface check in vllm_surface flags the rename).
        remote = getattr(self, "_is_remote_reader", False)
        if not remote or getattr(self, "_is_local_reader", True):
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
