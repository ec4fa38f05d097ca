"""Sharing one small object per rank with a vLLM process group, once every rank is known to
run the plugin's runner (a rank on vLLM's own never joins, so its peers would wait forever)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

#: Seconds a rank waits, model loaded, for its peers' runners (built before their models).
PEER_WAIT_S = 60.0


class PeerRunnerError(RuntimeError):
    """A rank this rank exchanges with does not run the plugin's runner."""


def _key(rank: int) -> str:
    return f"vllm_pp_cudagraph/runner/{rank}"


def _default_store() -> Any:
    from torch.distributed import distributed_c10d
    return distributed_c10d._get_default_store()


def announce_runner(rank: int, store: Any = None) -> None:
    """Tell the engine's other ranks that global ``rank`` runs the plugin's runner."""
    (store or _default_store()).set(_key(rank), "1")


def check_peer_runners(peers: dict[int, str], store: Any = None,
                       timeout_s: float | None = None) -> None:
    """Wait until every rank of ``peers`` (global rank: its name) announced the plugin's
    runner; raise naming those that did not within ``timeout_s`` (:data:`PEER_WAIT_S`)."""
    store = store or _default_store()
    timeout_s = PEER_WAIT_S if timeout_s is None else timeout_s
    try:
        store.wait([_key(rank) for rank in peers], timedelta(seconds=timeout_s))
        return
    except RuntimeError:  # torch's DistStoreError on a timeout
        missing = [what for rank, what in peers.items() if not store.check([_key(rank)])]
    if missing:
        raise PeerRunnerError(
            f"vllm-pp-cudagraph: {', '.join(missing)} did not start the plugin's runner "
            f"within {timeout_s:.0f} s, so it runs vLLM's own (the plugin is not installed "
            "where it runs, or VLLM_PLUGINS does not name pp_cudagraph there) and would "
            "leave this rank waiting for it. Install vllm-pp-cudagraph on every node and "
            "set VLLM_PLUGINS=pp_cudagraph for every worker, or leave pp_cudagraph out of "
            "VLLM_PLUGINS everywhere.")


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


def exchange_peers() -> dict[int, str]:
    """The global ranks of this rank's pipeline and TP groups, named by stage and TP rank."""
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group
    pp, tp = get_pp_group(), get_tp_group()
    peers = {rank: f"pipeline stage {stage}" for stage, rank in enumerate(pp.ranks)}
    for tp_rank, rank in enumerate(tp.ranks):
        peers.setdefault(rank, f"pipeline stage {pp.rank_in_group} TP rank {tp_rank}")
    return peers
