"""Where torch.compile splits the model for piecewise CUDA graphs.

vLLM splits the compiled graph at every attention op and, since the KV-cache
write became an op of its own, at that op too (``unified_kv_cache_update``).
Each split runs eagerly between graph replays. The KV-cache write was split
out because its ``layer_name`` argument was a string constant that stopped
Inductor from reusing one compiled piece for every layer (vLLM issue #33267).
On torch >= 2.11 vLLM passes layer names as hoisted opaque values
(``LayerName``), so one piece still serves every layer with the write inside.

Eager, the write costs a whole custom-op round trip on the host per layer:
about 200 us against a 2 us kernel, some 30% of the forward's host time in a
PIECEWISE decode step at PP=2 (14 layers per stage). Inside the piece's graph
it is one more captured kernel. Its inputs are already graph-safe: MRV2 computes
slot mappings into one persistent buffer, padded with the pad slot, which is
what its FULL graphs (which capture the write) rely on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_pp_cudagraph import compat


def kv_update_ops_to_keep_in_graphs(compilation_config: Any) -> tuple[str, ...]:
    """The KV-cache-write ops that may leave ``splitting_ops`` for this config.

    Empty unless vLLM chose the split points itself (the user set none), the
    model is compiled piecewise by vLLM (not Inductor graph partition), and
    layer names are hoisted opaque values.
    """
    from vllm.config import CompilationMode

    if compilation_config.mode != CompilationMode.VLLM_COMPILE:
        return ()
    if compilation_config.use_inductor_graph_partition:
        return ()
    if not compat.layer_names_are_hoisted():
        return ()
    ops = compilation_config.splitting_ops or []
    return tuple(op for op in compat.KV_CACHE_UPDATE_OPS if op in ops)


def keeping_kv_update_in_graphs(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``CompilationConfig.set_splitting_ops_for_v1``: drop the KV-write splits.

    Only split points vLLM defaulted are changed; an explicit
    ``splitting_ops`` is the user's and stays as given.
    """

    @functools.wraps(original)
    def set_splitting_ops_for_v1(self: Any, *args: Any, **kwargs: Any) -> None:
        user_chose = self.splitting_ops is not None
        original(self, *args, **kwargs)
        if user_chose:
            return
        keep = kv_update_ops_to_keep_in_graphs(self)
        if keep:
            self.splitting_ops = [op for op in self.splitting_ops if op not in keep]

    return set_splitting_ops_for_v1
