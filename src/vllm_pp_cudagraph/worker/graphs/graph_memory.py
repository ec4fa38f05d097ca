"""Measure CUDA-graph memory before the KV cache is sized (vLLM issue #49224)."""

from __future__ import annotations

import gc

import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_pp_group, graph_capture
from vllm.forward_context import set_forward_context

from vllm_pp_cudagraph.worker.graphs.capture_guard import forbid_pipeline_communication


def planned_graph_count(
    mode: CUDAGraphMode, capture_sizes: list[int], lora_capture_cases: int = 1
) -> int:
    """Upper bound on graphs for ``mode`` (before resolution), per LoRA capture case."""
    if mode == CUDAGraphMode.NONE or not capture_sizes:
        return 0
    per_size = int(mode.mixed_mode() != CUDAGraphMode.NONE)
    if mode.separate_routine() and mode.decode_mode() != CUDAGraphMode.NONE:
        per_size += 1
    return per_size * len(capture_sizes) * max(lora_capture_cases, 1)


#: The device's page (free-memory readings move in these steps): a graph's least cost.
MIN_BYTES_PER_GRAPH = 2 << 20


def extrapolate(samples: list[int], num_graphs: int) -> int:
    """First sample (shared pool) plus the second (at least a page) for each further graph."""
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
            # torch.cuda.graph() empties the allocator cache; do it first for a fair reading.
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
