"""Sharing one small Python object per rank with every rank of a vLLM process group."""

from __future__ import annotations

from typing import Any


def gather_from_group(obj: Any, group: Any) -> list[Any]:
    """Return every rank's ``obj`` of vLLM's ``group``, in rank order, on every rank; call
    it on all ranks at the same point, outside graph capture (gloo broadcasts)."""
    import torch.distributed as dist

    gathered = []
    for src in range(group.world_size):
        box = [obj if src == group.rank_in_group else None]
        if group.world_size > 1:
            dist.broadcast_object_list(box, src=group.ranks[src], group=group.cpu_group)
        gathered.append(box[0])
    return gathered


def gather_from_stages(obj: Any) -> list[Any]:
    """Every pipeline stage's ``obj`` (this rank's pipeline group), in stage order."""
    from vllm.distributed.parallel_state import get_pp_group

    return gather_from_group(obj, get_pp_group())


def gather_from_tp_peers(obj: Any) -> list[Any]:
    """Every tensor-parallel peer's ``obj`` within this stage, in TP rank order."""
    from vllm.distributed.parallel_state import get_tp_group

    return gather_from_group(obj, get_tp_group())
