"""Where torch.compile splits the model for piecewise CUDA graphs.

vLLM splits the compiled graph at every attention op and, since the KV-cache
write became an op of its own, at that op too (``unified_kv_cache_update``).
Each split runs eagerly between graph replays. The KV-cache write was split
out because its ``layer_name`` argument was a string constant that stopped
Inductor from reusing one compiled piece for every layer (vLLM issue #33267).
On torch >= 2.11 vLLM passes layer names as hoisted opaque values
(``LayerName``), so one piece still serves every layer with the write inside.

Eager, the write costs a whole custom-op round trip on the host per layer,
far more than its kernel. Inside the piece's graph
it is one more captured kernel. Its inputs are already graph-safe: MRV2 computes
slot mappings into one persistent buffer, padded with the pad slot, which is
what its FULL graphs (which capture the write) rely on. How much this saves is
measured in docs/performance.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_pp_cudagraph import compat

#: Attention backends the plugin's token checks have run with the KV-cache write inside
#: its piecewise graphs (docs/deployments.md). A backend asked for by name outside
#: these keeps vLLM's split; where vLLM chooses, it picks among these on NVIDIA GPUs.
KV_UPDATE_PROVEN_BACKENDS = frozenset({"FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"})


def kv_update_can_stay_in_graphs(vllm_config: Any) -> bool:
    """Whether the KV-cache write may leave ``splitting_ops`` for this config.

    Only where it is proven: pipeline parallelism (the plugin changes nothing
    at PP=1), no context parallelism (MRV2 then writes the cache through its own
    gathered slot mapping), vLLM compiling piecewise itself (not Inductor graph
    partition), layer names hoisted as opaque values, and no attention backend
    asked for outside :data:`KV_UPDATE_PROVEN_BACKENDS`. The MLA write, whose
    metadata is built on the host, is never moved.
    """
    from vllm.config import CompilationMode

    compilation = vllm_config.compilation_config
    parallel = vllm_config.parallel_config
    return (
        parallel.pipeline_parallel_size > 1
        and getattr(parallel, "prefill_context_parallel_size", 1) == 1
        and getattr(parallel, "decode_context_parallel_size", 1) == 1
        and compilation.mode == CompilationMode.VLLM_COMPILE
        and not compilation.use_inductor_graph_partition
        and compat.layer_names_are_hoisted()
        and compat.asked_attention_backends(vllm_config) <= KV_UPDATE_PROVEN_BACKENDS
    )


def keeping_kv_update_in_graphs(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``VllmConfig.__post_init__``: drop the KV-write split vLLM defaulted.

    vLLM picks the split points while the config is built
    (``set_splitting_ops_for_v1``); only then are the parallel settings known
    together with them. Split points the user gave stay as given.
    """

    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        user_chose = self.compilation_config.splitting_ops is not None
        original(self, *args, **kwargs)
        ops = self.compilation_config.splitting_ops
        if user_chose or not ops or compat.KV_CACHE_UPDATE_OP not in ops:
            return
        if kv_update_can_stay_in_graphs(self):
            self.compilation_config.splitting_ops = [
                op for op in ops if op != compat.KV_CACHE_UPDATE_OP
            ]

    return __post_init__
