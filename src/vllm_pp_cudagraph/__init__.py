"""Pipeline-parallel CUDA graphs for vLLM's Model Runner V2: ``VLLM_PLUGINS=pp_cudagraph``, or
:func:`build_runner` and the classes, loaded on first access (no vLLM worker code before)."""

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
