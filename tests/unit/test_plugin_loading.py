"""The plugin as vLLM itself loads it: entry point, VLLM_PLUGINS gate, runner swap."""

from __future__ import annotations

import inspect
import re
from importlib.metadata import entry_points

from conftest import DATA, run_python

# Runs vLLM's own plugin loader in a fresh process, from the call a vLLM worker loads
# it with (so the plugin applies a worker's patches), then reports what the worker's
# runner import resolves to and which runner the config selects for
# a MoE model that vLLM 0.26 would otherwise run on the V1 runner.
# The config is built before the plugin loads because on a machine without a
# GPU vLLM refuses to validate a V2 config (no Triton driver); the property the
# scheduler and workers read is re-evaluated on every access.
LOAD_AND_REPORT = f"""
import argparse, json, os
import vllm.logger
if hasattr(vllm.logger, "configure_logging_from_args"):  # 0.31+: a process configures it
    vllm.logger.configure_logging_from_args(argparse.Namespace())
from vllm.config import DeviceConfig, ModelConfig, VllmConfig
moe = ModelConfig(model="{DATA / 'qwen3_moe_tiny'}", skip_tokenizer_init=True)
config = VllmConfig(model_config=moe, device_config=DeviceConfig(device="cpu"))
from vllm.plugins import load_general_plugins
from vllm.v1.worker.worker_base import WorkerWrapperBase
class Worker(WorkerWrapperBase):
    def init_worker(self):  # as vLLM's worker process loads its plugins
        load_general_plugins()
Worker.__new__(Worker).init_worker()
import inspect
import re
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2
from vllm_pp_cudagraph import plugin
from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph import patches
plugin.register()  # a second call in the same process
factory = vllm_surface.worker_runner_factory()
builder = getattr(*factory) if factory else GPUModelRunnerV2
print(json.dumps({{
    "runner_is_plugin": builder is not inspect.unwrap(builder),
    "runner_name": inspect.unwrap(GPUModelRunnerV2).__name__,
    "v2_env": os.environ.get("VLLM_USE_V2_MODEL_RUNNER"),
    "moe_uses_v2": config.use_v2_model_runner,
    "applied": patches.is_applied(),
}}))
"""


def test_entry_point_is_discovered_from_installed_metadata():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "pp_cudagraph"]
    assert len(eps) == 1
    from vllm_pp_cudagraph.plugin import register

    assert eps[0].value == "vllm_pp_cudagraph.plugin:register"
    assert eps[0].load() is register


def test_worker_still_imports_the_runner_from_the_patched_module():
    # The runner swap relies on Worker.init_device importing GPUModelRunner
    # from this module at call time; fail loudly if a vLLM release moves it.
    from vllm.v1.worker.gpu_worker import Worker

    # (Worker.init_device up to 0.31, Worker._make_model_runner from 0.32).
    source = inspect.getsource(Worker)
    assert "from vllm.v1.worker.gpu.model_runner import" in source
    assert "GPUModelRunner as GPUModelRunnerV2" in source


def test_vllm_loader_with_plugin_named_swaps_runner_and_keeps_vllms_runner_choice():
    """The V2 runner class is the plugin's; which models run on V2 stays vLLM's
    choice (a MoE model vLLM 0.26 keeps on V1 stays there)."""
    report, log = run_python(LOAD_AND_REPORT, {"VLLM_PLUGINS": "pp_cudagraph"})
    assert report["runner_is_plugin"], report
    assert report["v2_env"] is None
    assert report["moe_uses_v2"] is report_without_plugin()["moe_uses_v2"]
    assert report["applied"] is True
    # One "active" line per process, even though register() ran twice.
    assert log.count("vllm-pp-cudagraph active in the worker") == 1
    assert re.search(r"patched .*\brunner-factory\b", log)


_without_plugin: list[tuple[dict, str]] = []


def report_without_plugin() -> dict:
    if not _without_plugin:
        _without_plugin.append(run_python(LOAD_AND_REPORT, {"VLLM_PLUGINS": None}))
    return _without_plugin[0][0]


def test_vllm_loader_without_plugins_setting_leaves_vllm_untouched():
    report = report_without_plugin()
    log = _without_plugin[0][1]
    assert {k: v for k, v in report.items() if k != "moe_uses_v2"} == {
        "runner_is_plugin": False,
        "runner_name": "GPUModelRunner",
        "v2_env": None,
        "applied": False,
    }
    assert log.count("set VLLM_PLUGINS=pp_cudagraph") == 1


def test_vllm_loader_with_other_plugin_named_never_calls_us():
    report, log = run_python(LOAD_AND_REPORT, {"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert report["runner_is_plugin"] is False
    assert report["v2_env"] is None
    assert report["applied"] is False
    assert "vllm-pp-cudagraph active" not in log
