"""Piecewise split points: the KV-cache write stays inside the graphs, only when safe."""

from __future__ import annotations

import pytest
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DeviceConfig,
    VllmConfig,
)

from vllm_pp_cudagraph import compat, patches
from vllm_pp_cudagraph.piecewise_split import kv_update_ops_to_keep_in_graphs
from vllm_pp_cudagraph.settings import PPCudaGraphSettings

KV_WRITE = "vllm::unified_kv_cache_update"
ATTENTION = "vllm::unified_attention_with_output"


def build(**compilation) -> VllmConfig:
    compilation.setdefault("mode", CompilationMode.VLLM_COMPILE)
    compilation.setdefault("cudagraph_mode", CUDAGraphMode.PIECEWISE)
    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        compilation_config=CompilationConfig(**compilation),
    )


@pytest.fixture
def kv_in_graphs(clean_env):
    """The plugin's split-point patch alone (the others need a GPU-ready vLLM)."""
    undo = patches._patch_kv_update_in_graphs(PPCudaGraphSettings())
    yield
    undo()


def test_stock_vllm_splits_at_the_kv_cache_write():
    ops = build().compilation_config.splitting_ops
    assert KV_WRITE in ops and ATTENTION in ops


def test_plugin_keeps_the_write_in_the_graphs_and_still_splits_at_attention(kv_in_graphs):
    ops = build().compilation_config.splitting_ops
    assert not set(compat.KV_CACHE_UPDATE_OPS) & set(ops)
    assert ATTENTION in ops
    # everything else vLLM chose is kept, in its order
    assert ops == list(CompilationConfig._attention_ops)


def test_split_points_the_user_gave_are_left_alone(kv_in_graphs):
    chosen = [ATTENTION, KV_WRITE]
    assert build(splitting_ops=list(chosen)).compilation_config.splitting_ops == chosen


def test_without_hoisted_layer_names_vllm_split_is_kept(kv_in_graphs, monkeypatch):
    # Inductor would compile one piece per layer: keep vLLM's reason for the split.
    from vllm.utils import torch_utils

    monkeypatch.setattr(torch_utils, "_USE_LAYERNAME", False)
    assert not compat.layer_names_are_hoisted()
    assert KV_WRITE in build().compilation_config.splitting_ops


def test_only_vllm_compiled_piecewise_split_is_changed():
    def config(**kw):
        c = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, **kw)
        c.splitting_ops = [ATTENTION, KV_WRITE]
        return c

    assert kv_update_ops_to_keep_in_graphs(config()) == (KV_WRITE,)
    # Inductor graph partition splits elsewhere; no compilation means no split
    assert kv_update_ops_to_keep_in_graphs(config(use_inductor_graph_partition=True)) == ()
    eager = config()
    eager.mode = CompilationMode.NONE
    assert kv_update_ops_to_keep_in_graphs(eager) == ()


def test_setting_off_applies_nothing_and_undo_restores(clean_env):
    assert patches._patch_kv_update_in_graphs(
        PPCudaGraphSettings(kv_update_in_graphs=False)
    ) is None
    assert KV_WRITE in build().compilation_config.splitting_ops

    undo = patches._patch_kv_update_in_graphs(PPCudaGraphSettings())
    assert KV_WRITE not in build().compilation_config.splitting_ops
    undo()
    assert KV_WRITE in build().compilation_config.splitting_ops
    assert not hasattr(CompilationConfig.set_splitting_ops_for_v1, "__wrapped__")


def test_setting_is_read_from_the_environment(clean_env):
    clean_env.setenv("VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS", "0")
    assert PPCudaGraphSettings.from_env().kv_update_in_graphs is False
    clean_env.delenv("VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS")
    assert PPCudaGraphSettings.from_env().kv_update_in_graphs is True
