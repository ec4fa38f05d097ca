"""Breakable mode: the plugin setting, and combinations that cannot work."""

from __future__ import annotations

import pytest
from conftest import DATA, run_python
from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, VllmConfig

from vllm_pp_cudagraph import plugin
from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared.settings import PluginConfigError
from vllm_pp_cudagraph.worker.model_runner import GraphConfigError, check_graph_settings

REPORT_BREAKABLE = """
import json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
from vllm.model_executor.layers.attention import attention
print(json.dumps({
    "env": os.environ.get("VLLM_USE_BREAKABLE_CUDAGRAPH"),
    "enabled": is_breakable_cudagraph_enabled(),
    "attention_op_wraps": attention.unified_attention_with_output.__code__.co_qualname
    == "eager_break_during_capture.<locals>.wrapper",
}))
"""

# Up to 0.32 vLLM decorates attention ops for breakable graphs only if the switch is on
# when they are imported; from 0.33 it always wraps them, and the wrapper breaks only
# inside the breakable capture that MRV2's graph manager starts with the switch on.
DECIDED_AT_IMPORT = vllm_surface.breakable_decided_at_import()


def test_plugin_setting_turns_on_breakable_graph_breaks_in_a_new_process():
    report, _ = run_python(
        REPORT_BREAKABLE, {"VLLM_PLUGINS": "pp_cudagraph", "VLLM_PP_CUDAGRAPH_BREAKABLE": "1"}
    )
    assert report == {"env": "1", "enabled": True, "attention_op_wraps": True}


def test_without_the_setting_attention_ops_do_not_break():
    report, _ = run_python(REPORT_BREAKABLE, {"VLLM_PLUGINS": "pp_cudagraph"})
    assert report["env"] is None and report["enabled"] is False
    assert report["attention_op_wraps"] is not DECIDED_AT_IMPORT


@pytest.mark.skipif(not DECIDED_AT_IMPORT, reason="this vLLM reads the breakable switch "
                    "when the attention op runs, not when it is imported (0.33+)")
def test_breakable_setting_after_attention_import_is_refused(clean_env):
    import vllm.model_executor.layers.attention.attention  # noqa: F401

    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_BREAKABLE", "1")
    with pytest.raises(PluginConfigError, match="came too late"):
        plugin.register()
    assert not patches.is_applied()


@pytest.mark.skipif(DECIDED_AT_IMPORT, reason="this vLLM reads the breakable switch when "
                    "attention modules are imported (up to 0.32): a later setting is refused")
def test_breakable_setting_after_attention_import_takes_effect(clean_env):
    from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
    from vllm.model_executor.layers.attention import attention

    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_BREAKABLE", "1")
    plugin.register()
    assert patches.is_applied()
    assert is_breakable_cudagraph_enabled()
    assert attention.unified_attention_with_output.__code__.co_qualname == (
        "eager_break_during_capture.<locals>.wrapper"
    )


def test_breakable_setting_contradicting_vllm_switch_is_refused(clean_env):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_BREAKABLE", "1")
    clean_env.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0")
    with pytest.raises(PluginConfigError, match="VLLM_USE_BREAKABLE_CUDAGRAPH='0'"):
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
