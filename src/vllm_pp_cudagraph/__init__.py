"""Pipeline-parallel CUDA graphs for vLLM's Model Runner V2, as a vLLM plugin.

Enable it with ``VLLM_PLUGINS=pp_cudagraph``, or use :func:`build_runner` or the classes
directly: they load on first access, so an inactive plugin pulls in no vLLM worker code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

__all__ = ["PPCudaGraphManager", "PPCudaGraphModelRunner", "__version__", "build_runner"]

if TYPE_CHECKING:
    from vllm_pp_cudagraph.worker.graphs.cudagraph_manager import PPCudaGraphManager
    from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner, build_runner

_LAZY = {
    "PPCudaGraphModelRunner": "vllm_pp_cudagraph.worker.model_runner",
    "PPCudaGraphManager": "vllm_pp_cudagraph.worker.graphs.cudagraph_manager",
    "build_runner": "vllm_pp_cudagraph.worker.model_runner",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm_pp_cudagraph' has no attribute {name!r}")
