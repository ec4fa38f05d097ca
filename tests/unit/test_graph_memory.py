"""Graph memory is estimated for every graph the manager will capture."""

from __future__ import annotations

import pytest
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

from vllm_pp_cudagraph.worker.graphs.graph_memory import extrapolate, planned_graph_count


@pytest.mark.parametrize(
    "mode, graphs_per_size",
    [("NONE", 0), ("PIECEWISE", 1), ("FULL", 1), ("FULL_DECODE_ONLY", 1), ("FULL_AND_PIECEWISE", 2)],
)
def test_planned_graph_count(mode, graphs_per_size):
    assert planned_graph_count(CUDAGraphMode[mode], [1, 2, 4]) == 3 * graphs_per_size


def test_memory_extrapolation_counts_shared_pool_once():
    mib = 1 << 20
    assert extrapolate([100 * mib, 5 * mib], 5) == 100 * mib + 4 * 5 * mib
    assert extrapolate([100 * mib], 1) == 100 * mib
    assert extrapolate([], 3) == 0


def test_a_second_sample_under_one_page_still_costs_a_page_per_graph():
    """The 2x H200 readings: 60 MiB, then 0; capture then used 133 MiB for 35 graphs."""
    mib = 1 << 20
    estimate = extrapolate([60 * mib, 0], 35)
    assert estimate == 60 * mib + 34 * 2 * mib
    assert abs(estimate - 133 * mib) / (133 * mib) < 0.05


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
@pytest.mark.parametrize("lora_cases", [[0], [0, 1, 2, 4]])
def test_planned_count_covers_every_graph_vllm_captures_lora_included(
    make_manager, mode, lora_cases
):
    """With --enable-lora MRV2 captures each shape once per LoRA capture case;
    an estimate that counted shapes alone would reserve a fraction of it."""
    sizes = [1, 2, 4, 8, 16, 32]

    class WithLora(ModelCudaGraphManager):
        def __init__(self, *args):
            super().__init__(*args, lora_capture_cases=lora_cases)

    manager = make_manager(mode, sizes, 32, cls=WithLora)
    captured = sum(len(d) for d in manager._capture_descs.values())
    planned = planned_graph_count(CUDAGraphMode[mode], sizes, len(lora_cases))
    assert captured <= planned <= 2 * captured
