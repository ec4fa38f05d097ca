"""Passing intermediate tensors to the next pipeline stage without per-step metadata, with
``VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF=1``; docs/architecture.md (step 3, "Hand-off") says why."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

#: The methods of a pipeline group that :func:`enable` replaces.
DIRECT_METHODS = ("isend_tensor_dict", "irecv_tensor_dict")


class HandoffDisagreementError(RuntimeError):
    """Some pipeline stages hand tensors on directly and others as vLLM does."""


def check_stages_agree(direct_per_stage: list[bool]) -> None:
    """Stop start-up where stages disagree: one side would wait for metadata never sent."""
    if len(set(direct_per_stage)) > 1:
        on = [stage for stage, direct in enumerate(direct_per_stage) if direct]
        raise HandoffDisagreementError(
            f"Pipeline stages disagree on the direct hand-off: on for stages {on}, off for "
            "the others. Set VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF alike in the environment of "
            "every stage's process (on every node under Ray).")


class _SentMetadata:
    """Stands where vLLM's send returns the handle of its metadata send (always complete)."""

    def wait(self, timeout: object = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class PendingStageInput(dict):
    """One step's intermediate tensors: empty until :func:`receive_into` fills them."""

    def __init__(self, group: Any, src: int, all_gather_group: Any,
                 all_gather_tensors: dict[str, bool] | None) -> None:
        super().__init__()
        self.group, self.src = group, src
        self.all_gather_group, self.all_gather_tensors = all_gather_group, all_gather_tensors


def group_blocker(group: Any) -> str | None:
    """Why this process's pipeline ``group`` cannot hand tensors on directly, or None."""
    if getattr(group, "use_cpu_custom_send_recv", False):
        return "this platform's pipeline group sends through its own communicator"
    return None


def enable(group: Any) -> Callable[[], None]:
    """Hand tensors on directly on ``group``; return the undo (vLLM's methods back)."""
    group.isend_tensor_dict = functools.partial(send_tensors, group)
    group.irecv_tensor_dict = functools.partial(defer_receive, group)

    def undo() -> None:
        for name in DIRECT_METHODS:
            group.__dict__.pop(name, None)

    return undo


def _tp_share(group: Any, key: str, tensor: torch.Tensor, all_gather_group: Any,
              all_gather_tensors: Any) -> torch.Tensor | None:
    """This TP rank's contiguous share of ``tensor`` where vLLM would all-gather it."""
    if not group._should_use_all_gather(key, tensor.numel(), all_gather_group, all_gather_tensors):
        return None
    return tensor.reshape(all_gather_group.world_size, -1)[all_gather_group.rank_in_group]


def _comm_group(group: Any, tensor: torch.Tensor) -> Any:
    return group.cpu_group if tensor.is_cpu else group.device_group


def send_tensors(group: Any, tensor_dict: Mapping[str, torch.Tensor], dst: int | None = None,
                 all_gather_group: Any = None,
                 all_gather_tensors: dict[str, bool] | None = None) -> list:
    """Post the sends of ``tensor_dict``'s tensors to ``dst``, in key order; return handles."""
    if dst is None:
        dst = (group.rank_in_group + 1) % group.world_size
    handles: list = [_SentMetadata()]
    for key in sorted(tensor_dict):
        tensor = tensor_dict[key]
        if tensor.numel() == 0:
            continue
        share = _tp_share(group, key, tensor, all_gather_group, all_gather_tensors)
        tensor = tensor if share is None else share
        handles.append(dist.isend(tensor, dst=group.ranks[dst], group=_comm_group(group, tensor)))
        if tensor.is_cuda:
            tensor.record_stream(torch.cuda.current_stream(tensor.device))
    return handles


def defer_receive(group: Any, src: int | None = None, all_gather_group: Any = None,
                  all_gather_tensors: dict[str, bool] | None = None,
                  ) -> tuple[PendingStageInput, list, list]:
    """Stand in for ``irecv_tensor_dict``: nothing is posted until :func:`receive_into`."""
    if src is None:
        src = (group.rank_in_group - 1) % group.world_size
    return PendingStageInput(group, src, all_gather_group, all_gather_tensors), [], []


def receive_into(pending: PendingStageInput, buffers: Mapping[str, torch.Tensor],
                 num_tokens: int) -> None:
    """Receive the step's ``num_tokens`` rows of each key into ``buffers``; fill ``pending``."""
    group = pending.group
    received: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []
    handles = []
    for key in sorted(buffers):
        rows = buffers[key][:num_tokens]
        if rows.numel() == 0:
            received.append((key, rows, None))
            continue
        share = _tp_share(group, key, rows, pending.all_gather_group, pending.all_gather_tensors)
        target = rows if share is None else share
        handles.append(dist.irecv(target, src=group.ranks[pending.src],
                                  group=_comm_group(group, target)))
        received.append((key, rows, share))
    for handle in handles:
        handle.wait()
    for key, rows, share in received:
        if share is not None:
            gathered = pending.all_gather_group.all_gather(share, dim=0)
            rows.view(-1).copy_(gathered.view(-1))
        pending[key] = rows


def pending_input(received: object) -> PendingStageInput | None:
    """The :class:`PendingStageInput` inside vLLM's received intermediate tensors, if any."""
    if received is None:
        return None
    # Reading `.tensors` on vLLM's AsyncIntermediateTensors waits for the transfer.
    tensors = object.__getattribute__(received, "tensors")
    return tensors if isinstance(tensors, PendingStageInput) else None
