"""Uniform-decode FULL graphs: only shapes valid for uniform-query backends.

Exhaustive sweeps over batch sizes, max_num_seqs and speculative lengths
(decode query length 1 + num_speculative_tokens), against the plugin's real
manager and vLLM's own candidate construction.
"""

from __future__ import annotations

import itertools

import pytest
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

from vllm_pp_cudagraph.worker.graphs.descriptors import capture_num_reqs, captures_uniform_batch

SIZE_SETS = {
    "vllm-like": [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64],
    "odd": [1, 3, 5, 7, 13, 50],
}
MAX_SEQS = [1, 3, 8, 17, 32]
QUERY_LENS = [1, 2, 3, 4, 5]
MODES = ["FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"]


def all_capture_descs(manager):
    return [d for descs in manager._capture_descs.values() for d in descs]


def shapes():
    """(size set, max_num_seqs, decode query length): every combination, one test each mode."""
    return itertools.product(SIZE_SETS, MAX_SEQS, QUERY_LENS)


@pytest.mark.parametrize("mode", MODES)
def test_every_full_graph_captures_a_uniform_batch(make_manager, mode):
    for sizes, max_seqs, q in shapes():
        check_uniform_captures(make_manager(mode, SIZE_SETS[sizes], max_seqs, q), max_seqs)


def check_uniform_captures(manager, max_seqs):
    for desc in all_capture_descs(manager):
        if desc.cg_mode != CUDAGraphMode.FULL:
            continue
        num_reqs = capture_num_reqs(desc, max_seqs)
        assert desc.num_tokens % num_reqs == 0, desc
        assert num_reqs <= max_seqs, desc
        if desc.uniform_token_count is not None:
            assert desc.num_tokens == num_reqs * desc.uniform_token_count, desc


@pytest.mark.parametrize("mode", MODES)
def test_dispatch_only_returns_captured_and_covering_shapes(make_manager, mode):
    for sizes, max_seqs, q in shapes():
        check_dispatch(make_manager(mode, SIZE_SETS[sizes], max_seqs, q), sizes, max_seqs, q)


def check_dispatch(manager, sizes, max_seqs, q):
    manager._graphs_captured = True
    captured = set(all_capture_descs(manager))
    max_tokens = max(SIZE_SETS[sizes])
    # Uniform decode batches: r requests of q tokens each.
    batches = [(r, r * q, q) for r in range(1, max_seqs + 1)]
    # Mixed batches: r requests sharing t tokens.
    batches += [(r, t, None) for r in range(1, max_seqs + 1) for t in range(r, max_tokens + 1, 3)]
    for num_reqs, num_tokens, uniform in batches:
        desc = manager.dispatch(num_reqs, num_tokens, uniform, 0)
        if desc.cg_mode == CUDAGraphMode.NONE:
            continue
        assert desc in captured, (num_reqs, num_tokens, desc)
        assert desc.num_tokens >= num_tokens
        assert desc.num_reqs is None or desc.num_reqs >= num_reqs
        if desc.cg_mode == CUDAGraphMode.FULL:
            assert captures_uniform_batch(desc, max_seqs)
            if desc.uniform_token_count is not None:
                assert uniform == desc.uniform_token_count
                assert desc.num_tokens == desc.num_reqs * q


@pytest.mark.parametrize("mode", MODES)
def test_valid_stock_graphs_are_all_kept(make_manager, mode):
    """Only the non-uniform shapes go; decode graphs vLLM builds are untouched."""
    for sizes, max_seqs, q in shapes():
        ours = make_manager(mode, SIZE_SETS[sizes], max_seqs, q)
        stock = make_manager(mode, SIZE_SETS[sizes], max_seqs, q, cls=ModelCudaGraphManager)
        stock_descs = set(all_capture_descs(stock))
        expected = {d for d in stock_descs
                    if d.cg_mode != CUDAGraphMode.FULL or captures_uniform_batch(d, max_seqs)}
        assert set(all_capture_descs(ours)) == expected, (sizes, max_seqs, q)
