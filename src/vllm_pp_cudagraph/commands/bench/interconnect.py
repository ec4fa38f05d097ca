"""The links between GPUs a bench run may simulate on one host (``--interconnect``).

``nvlink`` leaves the host as it is. ``host`` and ``socket`` narrow NCCL's
transports to what a host without GPU peer-to-peer, or two nodes without
InfiniBand, would give; every vLLM path that moves data between GPUs outside
NCCL (custom all-reduce, symmetric memory, FlashInfer's fused all-reduce) is
turned off for every runner alike, so PP's hand-offs and TP's all-reduces both
go through the narrowed NCCL. Latency of a real network is not simulated.
"""

from __future__ import annotations

from typing import Any

#: Environment per interconnect. NCCL_P2P_DISABLE: no CUDA peer access between
#: the GPUs (copies through host memory); NCCL_SHM_DISABLE: no shared-memory
#: transport either, so NCCL falls back to its socket network over loopback.
_NO_BYPASS = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}
INTERCONNECT_ENV: dict[str, dict[str, str]] = {
    "nvlink": {},
    "host": {"NCCL_P2P_DISABLE": "1", **_NO_BYPASS},
    "socket": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1",
               "NCCL_NET": "Socket", **_NO_BYPASS},
}

#: What each simulates, for bench.json and the results' README.
SIMULATES = {
    "nvlink": "the host as it is (NVLink between the GPUs where it has it)",
    "host": "a PCIe host without GPU peer-to-peer: NCCL copies through host memory",
    "socket": "two nodes without InfiniBand: NCCL over TCP sockets on loopback "
              "(bandwidth-bound like a network, without its latency)",
}

INTERCONNECTS = tuple(INTERCONNECT_ENV)


def interconnect_options(interconnect: str) -> dict[str, Any]:
    """Engine options that keep data between GPUs on NCCL, for a narrowed interconnect."""
    if interconnect == "nvlink":
        return {}
    return {"disable_custom_all_reduce": True,
            "compilation_config": {"pass_config": {"fuse_allreduce_rms": False}}}


def merge_options(options: dict[str, Any], interconnect: str) -> dict[str, Any]:
    """``options`` (an engine's keyword arguments) with ``interconnect``'s added;
    their ``compilation_config`` dictionaries are merged, not replaced."""
    merged = dict(options)
    for key, value in interconnect_options(interconnect).items():
        if isinstance(value, dict):
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return merged
