"""Breakable mode: the plugin setting, and combinations that cannot work."""

from __future__ import annotations

import pytest
from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, VllmConfig

from conftest import DATA, run_python
from vllm_pp_cudagraph import patches, plugin
from vllm_pp_cudagraph.model_runner import GraphConfigError, check_graph_settings

REPORT_BREAKABLE = """
import json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.model_executor.layers.attention import attention
print(json.dumps({
    "env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
    "attention_op_breaks": attention.unified_attention_with_output.__code__.co_qualname
    == "eager_break_during_capture.<locals>.wrapper",
}))
"""


def test_plugin_setting_turns_on_breakable_graph_breaks_in_a_new_process():
    report, _ = run_python(
        REPORT_BREAKABLE, {"VLLM_PLUGINS": "pp_cudagraph", "VLLM_PP_CUDAGRAPH_BREAKABLE": "1"}
    )
    assert report == {"env": "1", "attention_op_breaks": True}


def test_without_the_setting_attention_ops_do_not_break():
    report, _ = run_python(REPORT_BREAKABLE, {"VLLM_PLUGINS": "pp_cudagraph"})
    assert report == {"env": None, "attention_op_breaks": False}


def test_breakable_setting_after_attention_import_is_refused(clean_env):
    import vllm.model_executor.layers.attention.attention  # noqa: F401

    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_BREAKABLE", "1")
    with pytest.raises(patches.PluginConfigError, match="came too late"):
        plugin.register()
    assert not patches.is_applied()


def test_breakable_setting_contradicting_vllm_switch_is_refused(clean_env):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_BREAKABLE", "1")
    clean_env.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    with pytest.raises(patches.PluginConfigError, match="VLLM_USE_BREAKABLE_CUDAGRAPH='0'"):
        plugin.register()


def test_breakable_with_cudagraph_mode_none_is_refused(monkeypatch):
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        compilation_config=CompilationConfig(cudagraph_mode="NONE"),
    )
    with pytest.raises(GraphConfigError, match="cudagraph_mode=NONE"):
        check_graph_settings(config)


def test_breakable_with_enforce_eager_is_refused(monkeypatch):
    model = ModelConfig(model=str(DATA / "qwen3_moe_tiny"), skip_tokenizer_init=True, enforce_eager=True)
    config = VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"))
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    with pytest.raises(GraphConfigError, match="enforce_eager=True"):
        check_graph_settings(config)
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    check_graph_settings(config)  # eager without breakable is fine
