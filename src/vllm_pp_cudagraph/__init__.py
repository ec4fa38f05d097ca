"""Pipeline-parallel CUDA graphs for vLLM's Model Runner V2, as a vLLM plugin.

Enable it in a vLLM deployment with ``VLLM_PLUGINS=pp_cudagraph``; or build the runner
through :func:`build_runner` (the plugin's runner, or vLLM's own where the plugin stands
aside), or import :class:`PPCudaGraphModelRunner` / :class:`PPCudaGraphManager`
directly. Those names are loaded on first access, so importing this package stays cheap
(the plugin entry point must not pull in vLLM's worker code when inactive).
"""

from __future__ import annotations

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
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm_pp_cudagraph' has no attribute {name!r}")
