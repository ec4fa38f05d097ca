"""Under Ray, workers on other nodes start from the driver's environment as vLLM copies it:
the plugin's switch and settings must be among what it copies, or a remote stage would run
vLLM's own runner (refused at start by the engine check, test_engine_check.py)."""

from __future__ import annotations

import pytest

ray_env = pytest.importorskip("vllm.ray.ray_env")

SETTINGS = {
    "VLLM_PLUGINS": "pp_cudagraph",
    "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "merge",
    "VLLM_PP_CUDAGRAPH_LAYER_PARTITION": "auto",
    "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF": "1",
}


def test_the_plugins_settings_reach_ray_workers_on_other_nodes(clean_env):
    for name, value in SETTINGS.items():
        clean_env.setenv(name, value)
    copied = ray_env.get_env_vars_to_copy(destination="a worker on another node")
    assert set(SETTINGS) <= copied


def test_a_setting_excluded_from_the_copy_is_left_out(clean_env):
    """What an operator who excludes them sees: vLLM honours the exclusion, so the remote
    stage runs without them (and the engine check refuses a mixed engine)."""
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    copied = ray_env.get_env_vars_to_copy(exclude_vars={"VLLM_PLUGINS"})
    assert "VLLM_PLUGINS" not in copied
