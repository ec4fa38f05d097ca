"""Keeping the KV-cache write out of torch.compile's piecewise splits where that is proven."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.support import KV_UPDATE_PROVEN_BACKENDS

if TYPE_CHECKING:
    from vllm.config import VllmConfig


def kv_update_can_stay_in_graphs(vllm_config: VllmConfig) -> bool:
    """Whether the KV-cache write may leave ``splitting_ops`` for this config: PP > 1, no
    context parallelism, vLLM's own piecewise compile, hoisted layer names, proven backends."""
    from vllm.config import CompilationMode

    compilation = vllm_config.compilation_config
    parallel = vllm_config.parallel_config
    return (
        parallel.pipeline_parallel_size > 1
        and getattr(parallel, "prefill_context_parallel_size", 1) == 1
        and getattr(parallel, "decode_context_parallel_size", 1) == 1
        and compilation.mode == CompilationMode.VLLM_COMPILE
        and not compilation.use_inductor_graph_partition
        and vllm_surface.layer_names_are_hoisted()
        and vllm_surface.asked_attention_backends(vllm_config) <= KV_UPDATE_PROVEN_BACKENDS
    )


def wrap_config_post_init(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``VllmConfig.__post_init__``: drop the KV-write split vLLM defaulted, not a user's."""

    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        user_chose = self.compilation_config.splitting_ops is not None
        original(self, *args, **kwargs)
        ops = self.compilation_config.splitting_ops
        if user_chose or not ops or vllm_surface.KV_CACHE_UPDATE_OP not in ops:
            return
        if kv_update_can_stay_in_graphs(self):
            self.compilation_config.splitting_ops = [op for op in ops
                                                     if op != vllm_surface.KV_CACHE_UPDATE_OP]

    return __post_init__
