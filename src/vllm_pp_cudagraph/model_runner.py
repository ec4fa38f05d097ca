"""The plugin's Model Runner V2 subclass."""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph.cudagraph_manager import PPCudaGraphManager

logger = init_logger("vllm.pp_cudagraph.runner")


class PPCudaGraphModelRunner(GPUModelRunner):
    """Model Runner V2 with the plugin's pipeline-parallel CUDA-graph handling.

    vLLM's worker builds it in place of ``GPUModelRunner`` when the plugin is
    enabled; it can also be constructed directly with the same arguments.
    """

    cudagraph_manager: PPCudaGraphManager | None

    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        super().__init__(vllm_config, device)
        pp = self.parallel_config.pipeline_parallel_size
        logger.info(
            "PPCudaGraphModelRunner on pipeline stage %s of %d (first=%s, last=%s)",
            self._pp_rank(),
            pp,
            self.is_first_pp_rank,
            self.is_last_pp_rank,
        )

    def _pp_rank(self) -> int:
        from vllm.distributed.parallel_state import get_pp_group

        return get_pp_group().rank_in_group

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        super().initialize_kv_cache(kv_cache_config)
        # vLLM builds its own manager here; take its resolved mode and sizes
        # and continue with the plugin's manager instead.
        assert self.cudagraph_manager is not None
        self.cudagraph_manager = PPCudaGraphManager.replacing(self.cudagraph_manager)
