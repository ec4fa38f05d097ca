"""Piecewise split points: the KV-cache write stays inside the graphs, only when safe."""

from __future__ import annotations

import pytest
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    ParallelConfig,
    VllmConfig,
)

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

KV_WRITE = "vllm::unified_kv_cache_update"
MLA_KV_WRITE = "vllm::unified_mla_kv_cache_update"
ATTENTION = "vllm::unified_attention_with_output"


def build(pp: int = 2, **compilation) -> VllmConfig:
    compilation.setdefault("mode", CompilationMode.VLLM_COMPILE)
    compilation.setdefault("cudagraph_mode", CUDAGraphMode.PIECEWISE)
    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(pipeline_parallel_size=pp),
        compilation_config=CompilationConfig(**compilation),
    )


@pytest.fixture
def kv_in_graphs(clean_env):
    """The plugin's split-point patch alone (the others need a GPU-ready vLLM)."""
    undo = patches.apply_patch("kv-update-in-graphs", PPCudaGraphSettings())
    yield
    undo()


def test_stock_vllm_splits_at_the_kv_cache_write():
    ops = build().compilation_config.splitting_ops
    assert KV_WRITE in ops and ATTENTION in ops


def with_and_without_patch(**kwargs) -> tuple[list[str], list[str]]:
    """Split points vLLM picks for ``build(**kwargs)``, stock and with the patch."""
    stock = build(**kwargs).compilation_config.splitting_ops
    undo = patches.apply_patch("kv-update-in-graphs", PPCudaGraphSettings())
    try:
        patched = build(**kwargs).compilation_config.splitting_ops
    finally:
        undo()
    return stock, patched


def test_plugin_keeps_the_write_in_the_graphs_and_still_splits_at_attention(clean_env):
    stock, patched = with_and_without_patch()
    assert KV_WRITE in stock and KV_WRITE not in patched
    assert ATTENTION in patched
    # MLA's write (host-side metadata) is not proven inside graphs: still split
    assert MLA_KV_WRITE in patched
    # everything else vLLM chose is kept, in its order
    assert patched == [op for op in stock if op != KV_WRITE]


def test_at_pp1_vllms_split_is_kept(kv_in_graphs):
    # The plugin is for pipeline parallelism; a single stage is stock vLLM.
    assert KV_WRITE in build(pp=1).compilation_config.splitting_ops


def test_with_context_parallelism_vllms_split_is_kept(kv_in_graphs):
    config = build()
    config.parallel_config.prefill_context_parallel_size = 2
    config.compilation_config.splitting_ops = None
    from vllm_pp_cudagraph.api_server.piecewise_split import kv_update_can_stay_in_graphs

    assert not kv_update_can_stay_in_graphs(config)
    config.parallel_config.prefill_context_parallel_size = 1
    assert kv_update_can_stay_in_graphs(config)


@pytest.mark.parametrize("backend, moved", [("FLASH_ATTN", True), ("FLASHINFER", True),
                                            ("TRITON_ATTN", True), ("FLEX_ATTENTION", False)])
def test_the_write_moves_into_the_graphs_only_for_backends_proven_with_it(backend, moved,
                                                                          kv_in_graphs):
    from vllm.config import AttentionConfig

    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(pipeline_parallel_size=2),
        compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE,
                                             cudagraph_mode=CUDAGraphMode.PIECEWISE),
        attention_config=AttentionConfig(backend=backend),
    )
    assert (KV_WRITE not in config.compilation_config.splitting_ops) is moved


def test_split_points_the_user_gave_are_left_alone(kv_in_graphs):
    chosen = [ATTENTION, KV_WRITE]
    assert build(splitting_ops=list(chosen)).compilation_config.splitting_ops == chosen


def test_without_hoisted_layer_names_vllm_split_is_kept(kv_in_graphs, monkeypatch):
    # Inductor would compile one piece per layer: keep vLLM's reason for the split.
    from vllm.utils import torch_utils

    monkeypatch.setattr(torch_utils, "_USE_LAYERNAME", False)
    assert not vllm_surface.layer_names_are_hoisted()
    assert KV_WRITE in build().compilation_config.splitting_ops


def test_only_vllm_compiled_piecewise_split_is_changed(clean_env):
    # Inductor graph partition splits elsewhere; no compilation means no split.
    for kwargs in ({"use_inductor_graph_partition": True}, {"mode": CompilationMode.NONE}):
        stock, patched = with_and_without_patch(**kwargs)
        assert patched == stock, kwargs


def test_setting_off_applies_nothing_and_undo_restores(clean_env):
    off = PPCudaGraphSettings(kv_update_in_graphs=False)
    assert patches._kv_update_stands_aside(off) is not None
    assert patches.apply_patch("kv-update-in-graphs", off) is None
    assert KV_WRITE in build().compilation_config.splitting_ops

    undo = patches.apply_patch("kv-update-in-graphs", PPCudaGraphSettings())
    assert KV_WRITE not in build().compilation_config.splitting_ops
    undo()
    assert KV_WRITE in build().compilation_config.splitting_ops
    assert not hasattr(VllmConfig.__post_init__, "__wrapped__")


def test_setting_is_read_from_the_environment(clean_env):
    clean_env.setenv("VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS", "0")
    assert PPCudaGraphSettings.from_env().kv_update_in_graphs is False
    clean_env.delenv("VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS")
    assert PPCudaGraphSettings.from_env().kv_update_in_graphs is True
