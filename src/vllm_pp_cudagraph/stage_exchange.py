"""Sharing one small Python object per pipeline stage with every stage."""

from __future__ import annotations

from typing import Any


def gather_from_stages(obj: Any) -> list[Any]:
    """Return every stage's ``obj``, in stage order, on every stage.

    Uses one object broadcast per stage over the pipeline group's CPU (gloo)
    group rather than ``all_gather_object``, which does not work on gloo under
    inference mode (pytorch#126032); vLLM captures graphs under inference mode.
    Call it on all stages at the same point, outside CUDA-graph capture.
    """
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_pp_group

    group = get_pp_group()
    gathered = []
    for src in range(group.world_size):
        box = [obj if src == group.rank_in_group else None]
        if group.world_size > 1:
            dist.broadcast_object_list(box, src=group.ranks[src], group=group.cpu_group)
        gathered.append(box[0])
    return gathered
