"""vLLM's real ``AsyncScheduler`` at pipeline parallelism, built on CPU for tests."""

from __future__ import annotations

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16


def make_scheduler(model_dir: str, num_blocks: int = 8, pp: int = 2, max_num_seqs: int = 8) -> AsyncScheduler:
    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=256),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                                         max_model_len=256, is_encoder_decoder=False,
                                         async_scheduling=True),
        parallel_config=ParallelConfig(pipeline_parallel_size=pp),
        device_config=DeviceConfig(device="cpu"),
    )
    config.cache_config.num_gpu_blocks = num_blocks
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16,
                                                      dtype=torch.float32))])
    scheduler = AsyncScheduler(vllm_config=config, kv_cache_config=kv_cache,
                               structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)
    # MRV2 needs Triton, so on this CPU vLLM configures V1; the scheduler's PP decode
    # cadence is what is under test, and it follows this flag.
    scheduler.use_v2_model_runner = True
    return scheduler
