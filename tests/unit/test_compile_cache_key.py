"""A restart reuses vLLM's compile cache: the plugin leaves the cache key as a start found it.

vLLM names its torch.compile cache folder after a hash of its compile factors (the
values of the variables in ``vllm.envs.environment_variables``) and of the config. A
value that changes from one start to the next (the metrics directory the plugin makes
afresh on each start) would make every restart recompile every stage.
"""

from __future__ import annotations

from conftest import DATA, run_python

# One start of a worker process, as far as the cache key goes: vLLM loads its plugins,
# builds the engine's config (the plugin's config patch runs) and hashes what its
# compile backend hashes. The metrics directory is made afresh by each start.
KEY_OF_ONE_START = f"""
import json, os
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm import envs
from vllm.config import CompilationConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
from vllm.config.utils import hash_factors
model = ModelConfig(model="{DATA / 'qwen3_moe_tiny'}", skip_tokenizer_init=True)
config = VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"),
                    parallel_config=ParallelConfig(pipeline_parallel_size=2),
                    compilation_config=CompilationConfig(mode=3))
factors = envs.compile_factors()
print(json.dumps({{
    "env_hash": hash_factors(factors),
    "config_hash": config.compute_hash(),
    "plugin_factors": sorted(n for n in factors if n.startswith("VLLM_PP_CUDAGRAPH_")),
    # vLLM's own VLLM_PLUGINS is a factor, and names the plugin only where it runs.
    "hash_beside_plugins": hash_factors({{k: v for k, v in factors.items()
                                         if k != "VLLM_PLUGINS"}}),
    "metrics_dir": os.environ.get("VLLM_PP_CUDAGRAPH_METRICS_DIR"),
}}))
"""

PLUGIN = {"VLLM_PLUGINS": "pp_cudagraph", "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "merge"}


def test_two_starts_with_the_same_settings_share_the_compile_cache_key():
    first, _ = run_python(KEY_OF_ONE_START, PLUGIN)
    second, _ = run_python(KEY_OF_ONE_START, PLUGIN)
    # Each start made its own metrics directory, as a server does without the setting.
    assert first["metrics_dir"] and second["metrics_dir"]
    assert first["metrics_dir"] != second["metrics_dir"]
    assert first["env_hash"] == second["env_hash"]
    assert first["config_hash"] == second["config_hash"]


def test_the_plugins_settings_add_nothing_to_vllms_compile_factors():
    """What the plugin's settings change in the compiled graph reaches vLLM through its own
    config and variables (the split points, the breakable switch, the layer split), which
    vLLM hashes itself; the plugin's own variables are scheduling, hand-off, metrics and
    locations, so a plugin start hashes the same variables as a stock one."""
    stock, _ = run_python(KEY_OF_ONE_START, {"VLLM_PLUGINS": ""})
    plugin, _ = run_python(KEY_OF_ONE_START, {**PLUGIN, "VLLM_PP_CUDAGRAPH_METRICS": "1"})
    assert plugin["plugin_factors"] == []
    assert plugin["hash_beside_plugins"] == stock["hash_beside_plugins"]
