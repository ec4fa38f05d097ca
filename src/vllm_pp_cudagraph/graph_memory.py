"""Measure CUDA-graph memory before the KV cache is sized.

vLLM's worker sizes the KV cache from the memory left after a profiling run,
minus ``profile_cudagraph_memory()``. Stock Model Runner V2 returns 0 there,
so at a high ``gpu_memory_utilization`` the KV cache takes the memory the
graphs need and capture runs out of memory (vLLM issue #49224). The plugin's
runner measures instead: it captures the model's forward at the two largest
capture sizes into a throw-away pool (with attention skipped, as vLLM's own
profiling run does, since no KV cache exists yet) and extrapolates to the
number of graphs the configured mode will capture. The first sample holds the
pool's shared activations, the second the cost of one more graph (at least
one device page).
"""

from __future__ import annotations

import gc

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_pp_group, graph_capture
from vllm.forward_context import set_forward_context

from vllm_pp_cudagraph.capture_guard import forbid_pipeline_communication


def planned_graph_count(
    mode: CUDAGraphMode, capture_sizes: list[int], lora_capture_cases: int = 1
) -> int:
    """Upper bound on graphs for ``mode`` (before resolution).

    MRV2 captures each shape once per LoRA capture case (the active-adapter
    counts it keeps graphs for: one case without LoRA, more with it).
    """
    if mode == CUDAGraphMode.NONE or not capture_sizes:
        return 0
    per_size = int(mode.mixed_mode() != CUDAGraphMode.NONE)
    if mode.separate_routine() and mode.decode_mode() != CUDAGraphMode.NONE:
        per_size += 1
    return per_size * len(capture_sizes) * max(lora_capture_cases, 1)


#: The device hands out memory in 2 MiB pages, so a free-memory reading moves in
#: those steps: a second sample of 0 means "under one page", not "free"; each
#: further graph is counted at one page at least.
MIN_BYTES_PER_GRAPH = 2 << 20


def extrapolate(samples: list[int], num_graphs: int) -> int:
    """First sample (shared pool) plus the per-graph cost for the rest.

    Each further graph costs at least one device page (MIN_BYTES_PER_GRAPH).
    """
    if not samples or num_graphs == 0:
        return 0
    per_graph = max(samples[1] if len(samples) > 1 else 0, MIN_BYTES_PER_GRAPH)
    return max(samples[0], 0) + per_graph * (num_graphs - 1)


def _forward_inputs(runner, num_tokens: int) -> dict:
    num_reqs = min(num_tokens, runner.max_num_reqs)
    inputs = {
        "input_ids": runner.input_buffers.input_ids[:num_tokens],
        "positions": runner.input_buffers.positions[:num_tokens],
        **runner.model_state.prepare_dummy_inputs(num_reqs, num_tokens),
    }
    if not runner.is_first_pp_rank:
        inputs["input_ids"] = None
        inputs["inputs_embeds"] = None
        inputs["intermediate_tensors"] = runner.intermediate_tensors[:num_tokens]
    return inputs


@torch.inference_mode()
def measure(runner) -> tuple[int, list[int], int]:
    """Return (estimate in bytes, samples, planned graph count) for ``runner``."""
    config = runner.compilation_config
    sizes = sorted(config.cudagraph_capture_sizes or [], reverse=True)
    lora_cases = len(getattr(runner, "lora_capture_cases", None) or [0])
    num_graphs = planned_graph_count(config.cudagraph_mode, sizes, lora_cases)
    if num_graphs == 0:
        return 0, [], 0

    pool = torch.cuda.graph_pool_handle()
    graphs: list[torch.cuda.CUDAGraph] = []
    samples: list[int] = []
    with forbid_pipeline_communication((get_pp_group(),)), graph_capture(runner.device):
        for num_tokens in sizes[:2]:
            inputs = _forward_inputs(runner, num_tokens)

            def forward(n=num_tokens, inputs=inputs):
                with set_forward_context(
                    None,
                    runner.vllm_config,
                    num_tokens=n,
                    cudagraph_runtime_mode=CUDAGraphMode.NONE,
                ):
                    return runner.model(**inputs)

            forward()  # warm-up outside the graph (lazy init, kernel JIT)
            # torch.cuda.graph() empties the allocator cache on entry; do it
            # first so the reading before capture does not count cached blocks.
            gc.collect()
            torch.accelerator.synchronize()
            torch.accelerator.empty_cache()
            free_before = torch.accelerator.get_memory_info()[0]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                forward()
            torch.accelerator.synchronize()
            samples.append(free_before - torch.accelerator.get_memory_info()[0])
            graphs.append(graph)
    del graphs
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()
    return extrapolate(samples, num_graphs), samples, num_graphs
