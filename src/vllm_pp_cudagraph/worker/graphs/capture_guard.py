"""Refuse pipeline communication while CUDA graphs are being captured (vLLM issue #51887)."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

GUARDED_TORCH_FUNCTIONS = (
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
    "barrier", "monitored_barrier",
)

#: Methods of vLLM's GroupCoordinator that move data between pipeline stages.
GUARDED_GROUP_METHODS = (
    "send", "recv", "send_object", "recv_object", "send_tensor_dict", "recv_tensor_dict",
    "isend_tensor_dict", "irecv_tensor_dict", "broadcast", "broadcast_object",
    "broadcast_object_list", "broadcast_tensor_dict", "barrier",
)


class CapturedCommunicationError(RuntimeError):
    """A pipeline communication call happened while CUDA graphs were captured."""


_state = threading.local()


def capture_guard_active() -> bool:
    return getattr(_state, "active", False)


def _stream_capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _targets(args: tuple, kwargs: dict, process_groups: tuple[object, ...]) -> bool:
    candidates = [kwargs.get("group"), *args]
    return any(c is not None and any(c is g for g in process_groups) for c in candidates)


def _guarded(name: str, fn: Callable[..., Any],
             process_groups: tuple[object, ...] | None) -> Callable[..., Any]:
    """Refuse while active: always, or with ``process_groups`` only on those or while capturing."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if capture_guard_active() and (process_groups is None or _stream_capturing()
                                       or _targets(args, kwargs, process_groups)):
            raise CapturedCommunicationError(
                f"{name} was called during CUDA-graph capture. Pipeline "
                "communication must never be recorded into a graph (its peer is "
                "not replayed with it, so the step hangs). Move the call out of "
                "the captured forward, or run this model with enforce_eager=True.")
        return fn(*args, **kwargs)

    wrapper.__pp_cudagraph_guarded__ = True  # type: ignore[attr-defined]
    return wrapper


@contextlib.contextmanager
def forbid_pipeline_communication(groups: tuple[object, ...] = ()) -> Iterator[None]:
    """While active (on this thread), guarded calls raise :class:`CapturedCommunicationError`;
    ``groups`` are the GroupCoordinators (the pipeline group) whose methods are guarded."""
    restore: list[tuple[object, str, Any, bool]] = []

    def wrap(owner: object, attr: str, label: str, process_groups) -> None:
        fn = getattr(owner, attr, None)
        if fn is None or getattr(fn, "__pp_cudagraph_guarded__", False):
            return
        had_instance_attr = attr in getattr(owner, "__dict__", {})
        restore.append((owner, attr, owner.__dict__.get(attr), had_instance_attr))
        setattr(owner, attr, _guarded(label, fn, process_groups))

    process_groups = tuple(
        pg for group in groups
        for pg in (getattr(group, "cpu_group", None), getattr(group, "device_group", None))
        if pg is not None)
    for name in GUARDED_TORCH_FUNCTIONS:
        wrap(dist, name, f"torch.distributed.{name}", process_groups)
    for group in groups:
        label = getattr(group, "unique_name", type(group).__name__)
        for name in GUARDED_GROUP_METHODS:
            wrap(group, name, f"{label}.{name}", None)
    previous = capture_guard_active()
    _state.active = True
    try:
        yield
    finally:
        _state.active = previous
        for owner, attr, value, had_instance_attr in reversed(restore):
            if owner is dist or had_instance_attr:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)
