"""The plugin's CUDA-graph manager for Model Runner V2 under pipeline parallelism."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
from vllm.logger import init_logger
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

logger = init_logger("vllm.pp_cudagraph.manager")


class PPCudaGraphManager(ModelCudaGraphManager):
    """MRV2's model CUDA-graph manager with the plugin's PP handling.

    Owns the piecewise entry point (:meth:`run_pw_graph`), which runs either
    the torch.compile piecewise graphs or the breakable graph runner, and
    builds that runner lazily on the manager's own graph pool.
    """

    @classmethod
    def replacing(cls, stock: ModelCudaGraphManager) -> PPCudaGraphManager:
        """Build a manager with the same configuration as vLLM's ``stock`` one."""
        return cls(
            stock.vllm_config,
            stock.device,
            stock.cudagraph_mode,
            decode_query_len=stock.decode_query_len,
            lora_capture_cases=stock.lora_capture_cases,
        )

    def init_breakable_cg_runner(self, model: nn.Module) -> None:
        """Wrap ``model`` for breakable capture, once, sharing this manager's pool."""
        if self.breakable_cg_runner is not None:
            return
        runner = BreakableCUDAGraphWrapper(model, self.vllm_config)
        # Graph segments must come from the same pool as this manager's FULL
        # graphs so their memory is shared instead of reserved twice.
        if self.pool is not None:
            runner.graph_pool = self.pool
        self.breakable_cg_runner = runner

    def run_pw_graph(self, model: nn.Module, model_inputs: dict[str, Any]) -> Any:
        """Run one piecewise step: breakable graphs or torch.compile's graphs."""
        if not self.use_breakable_cg:
            return model(**model_inputs)
        if self.breakable_cg_runner is None:
            # Capture normally builds the runner; a PIECEWISE dispatch without
            # it means capture was skipped, which would be a plugin bug.
            raise RuntimeError(
                "Breakable CUDA graphs are enabled but were never captured on this "
                "rank; PIECEWISE steps cannot run. Disable breakable mode "
                "(unset VLLM_USE_BREAKABLE_CUDAGRAPH) and report this."
            )
        return self.breakable_cg_runner(**model_inputs)
