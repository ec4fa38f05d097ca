"""register(): re-entrancy, version gate, contradictory settings, clean undo."""

from __future__ import annotations

import os

import pytest
import vllm.v1.worker.gpu.model_runner as mr
from _scheduler import pp_engine_config

from vllm_pp_cudagraph import plugin
from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared.settings import PluginConfigError
from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner

STOCK_RUNNER = mr.GPUModelRunner
processes_here = patches.processes_here  # the real one; tests below stand in for it


@pytest.fixture(autouse=True)
def every_process(monkeypatch):
    """The test process stands for each kind of vLLM process at once (the tests of the
    processes' own patches below set it apart)."""
    monkeypatch.setattr(patches, "processes_here", lambda frame=None: patches.EVERY_PROCESS)


@pytest.fixture(autouse=True)
def worker(tmp_path, monkeypatch):
    """What vLLM's worker builds for a PP=2 MRV2 engine, through its own code path
    (``Worker._make_model_runner``, or before 0.32 its inline import); the runners'
    constructors are left out (no GPU here)."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    config = pp_engine_config(str(write_model_dir(tmp_path, tokenizer=False)))
    monkeypatch.setattr(STOCK_RUNNER, "__init__", lambda self, *args: None)
    monkeypatch.setattr(PPCudaGraphModelRunner, "__init__", lambda self, *args: None)

    def builds() -> type:
        if factory := vllm_surface.worker_runner_factory():
            worker = type("Worker", (), {"use_v2_model_runner": True, "vllm_config": config,
                                         "device": "cpu"})()
            return type(getattr(factory[0], factory[1])(worker))
        return type(mr.GPUModelRunner(config, "cpu"))

    return builds


def test_register_is_inert_without_vllm_plugins(clean_env, worker):
    plugin.register()
    assert worker() is STOCK_RUNNER
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ
    assert not patches.is_applied()


def test_register_twice_patches_once_and_undo_restores(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    plugin.register()
    assert worker() is PPCudaGraphModelRunner
    assert issubclass(PPCudaGraphModelRunner, STOCK_RUNNER)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ  # vLLM picks the runner

    plugin.register()
    assert worker() is PPCudaGraphModelRunner
    assert PPCudaGraphModelRunner.__mro__[1] is STOCK_RUNNER  # not re-subclassed
    assert patches.apply_all(patches_settings()) == []

    patches.undo_all()
    assert worker() is STOCK_RUNNER and mr.GPUModelRunner is STOCK_RUNNER
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ


def test_explicit_v2_setting_is_kept(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    plugin.register()
    assert worker() is PPCudaGraphModelRunner
    patches.undo_all()
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_v1_runner_requested_together_with_plugin_is_refused(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(PluginConfigError, match="VLLM_USE_V2_MODEL_RUNNER"):
        plugin.register()
    assert worker() is STOCK_RUNNER
    assert not patches.is_applied()


def test_each_patch_says_whether_it_stands_aside_here(clean_env):
    """``check`` reports this."""
    from vllm_pp_cudagraph.shared.settings import PluginConfigError, PPCudaGraphSettings

    standing = dict((p.name, why) for p, why in patches.standing(PPCudaGraphSettings()))
    assert standing["runner-factory"] is None
    assert standing["breakable-env"] == "VLLM_PP_CUDAGRAPH_BREAKABLE is off"
    off = PPCudaGraphSettings(decode_cadence="vllm", kv_update_in_graphs=False)
    assert dict((p.name, why) for p, why in patches.standing(off))["scheduler-class"]


def test_unsupported_vllm_version_is_refused_with_range_and_override(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setattr(vllm_surface, "installed_versions", lambda: vllm_surface.VersionInfo("0.25.1", "2.11.0"))
    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        plugin.register()
    message = str(err.value)
    assert "0.25.1" in message
    assert vllm_surface.SUPPORTED_RANGE in message
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1" in message
    assert worker() is STOCK_RUNNER
    assert not patches.is_applied()


def test_unsupported_version_override_activates(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "1")
    clean_env.setattr(vllm_surface, "installed_versions", lambda: vllm_surface.VersionInfo("0.40.0", "2.11.0"))
    plugin.register()
    assert worker() is PPCudaGraphModelRunner


def test_bad_setting_is_refused_before_anything_is_patched(clean_env, worker):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "maybe")
    with pytest.raises(ValueError, match="VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM"):
        plugin.register()
    assert worker() is STOCK_RUNNER


def test_failing_patch_leaves_nothing_half_applied(clean_env, worker):
    def broken(settings):
        raise RuntimeError("boom")

    failing = patches.Patch("broken", "nothing", "test", "never", patches.EVERY_PROCESS, broken)
    clean_env.setattr(patches, "PATCHES", (*patches.PATCHES, failing))
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    with pytest.raises(RuntimeError, match="boom"):
        plugin.register()
    assert worker() is STOCK_RUNNER
    assert not patches.is_applied()


def test_every_patch_applied_at_start_up_is_in_the_architecture_table():
    """``check`` names the patches; docs/architecture.md's registry table is where a
    reader looks each one up without reading the source."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    names = [patch.name for patch in patches.PATCHES]
    assert len(set(names)) == len(names), names
    for patch in patches.PATCHES:
        if not patch.scope:
            assert f"| `{patch.name}` |" in doc, patch.name


def test_scoped_patches_name_the_context_that_applies_them():
    import importlib

    scoped = [p for p in patches.PATCHES if p.scope]
    assert scoped
    for patch in scoped:
        assert patch.apply is None, patch.name
        module, _, attr = patch.scope.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), patch.scope


def patches_settings():
    from vllm_pp_cudagraph.shared.settings import PluginConfigError, PPCudaGraphSettings

    return PPCudaGraphSettings.from_env()


def _validate_vllm_environ() -> None:
    """vLLM's check of VLLM_* variables, failing hard (fail_on_environ_validation)."""
    from vllm import envs
    from vllm.platforms import current_platform

    if hasattr(type(current_platform), "validate_environ"):  # 0.33
        current_platform.validate_environ(True)
    else:
        envs.validate_environ(True)


@pytest.mark.parametrize("name, value", [("VLLM_PP_CUDAGRAPH_DECODE_CADENCE", "merge"),
                                         ("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")])
def test_the_plugins_settings_are_no_unknown_vllm_variables(name, value, clean_env):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        _validate_vllm_environ()  # stock vLLM refuses a VLLM_* name it does not know
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    plugin.register()
    try:
        _validate_vllm_environ()
        from vllm import envs

        # Known for the check alone: vLLM's table is what its compile-cache key hashes.
        assert name not in envs.environment_variables
    finally:
        patches.undo_all()
    with pytest.raises(ValueError, match=name):
        _validate_vllm_environ()  # undo leaves vLLM's table as it was


@pytest.mark.parametrize("name, value, says", [
    ("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "3,3", "VLLM_PP_LAYER_PARTITION=3,3"),
    ("VLLM_PP_CUDAGRAPH_METRICS_DIR", "/etc/passwd", "expected a directory")])
def test_a_bad_setting_stops_vllm_serve_with_one_line(name, value, says):
    """What an operator sees: one line naming the variable and what it takes, not a
    traceback through vLLM's argument parser, and a failed exit before anything starts.
    (Each setting's message: test_settings.py; the one line holds whichever it is.)"""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PP_CUDAGRAPH_")}
    env.update({"VLLM_PLUGINS": "pp_cudagraph", name: value})
    proc = subprocess.run([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve",
                           "/nonexistent-model", "-pp", "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("vllm-pp-cudagraph: ") and name in last and says in last


#: What each kind of process changes in vLLM, and nothing else: (owner, attribute).
OWN_TARGETS = {
    patches.Process.API_SERVER: {("vllm.config.vllm", "VllmConfig", "__post_init__")},
    patches.Process.ENGINE_CORE: {("vllm.v1.engine.core", "EngineCore", "_initialize_kv_caches"),
                                  ("vllm.distributed.device_communicators.shm_broadcast",
                                   "MessageQueue", "dequeue")},
    # Worker._make_model_runner from 0.32; before, the MRV2 class the worker imports inline.
    patches.Process.WORKER: {("vllm.v1.worker.gpu_worker", "Worker", "_make_model_runner")
                             if vllm_surface.worker_runner_factory() else
                             (vllm_surface.V2_RUNNER_MODULE, None, "GPUModelRunner")},
}


def _changed(before: dict) -> set:
    return {target for target, own in before.items() if _own(target) is not own}


def _own(target):
    import importlib

    module, cls, attr = target
    owner = importlib.import_module(module)
    return vars(owner if cls is None else getattr(owner, cls)).get(attr)


@pytest.mark.parametrize("process", list(patches.Process), ids=lambda p: p.name)
def test_each_process_applies_its_own_patches_and_no_others(process, clean_env):
    import vllm.plugins

    from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

    targets = set().union(*OWN_TARGETS.values())
    before = {target: _own(target) for target in targets}
    loader = vllm.plugins.load_general_plugins
    try:
        patches.apply_for(frozenset({process}), PPCudaGraphSettings())
        assert _changed(before) == OWN_TARGETS[process]
        assert vllm.plugins.load_general_plugins is not loader  # every process: the entry
    finally:
        patches.undo_all()
    assert _changed(before) == set() and vllm.plugins.load_general_plugins is loader


def test_a_forked_process_drops_its_parents_patches_for_its_own(clean_env, monkeypatch):
    """A worker forked from the engine core inherits its patches; entering the worker
    undoes them and applies the worker's."""
    import os

    from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

    targets = set().union(*OWN_TARGETS.values())
    before = {target: _own(target) for target in targets}
    settings = PPCudaGraphSettings()
    try:
        patches.apply_for(frozenset({patches.Process.ENGINE_CORE}), settings)
        parent = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent + 1)
        patches.apply_for(frozenset({patches.Process.WORKER}), settings)
        assert _changed(before) == OWN_TARGETS[patches.Process.WORKER]
        # An engine core keeping its workers in process adds theirs to its own.
        patches.apply_for(frozenset({patches.Process.ENGINE_CORE}), settings)
        assert _changed(before) == (OWN_TARGETS[patches.Process.WORKER]
                                    | OWN_TARGETS[patches.Process.ENGINE_CORE])
    finally:
        patches.undo_all()


def test_the_process_is_told_by_the_vllm_call_that_loads_the_plugin():
    """vLLM loads plugins from a worker's init_worker and the engine core's constructor;
    anything else is the API server (or an offline LLM's process)."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    seen = []

    class Wrapper(WorkerWrapperBase):
        def init_worker(self, *args):  # vLLM's frame: the plugin is loaded from here
            seen.append(processes_here())

    class Core(EngineCore):
        def __init__(self):
            seen.append(processes_here())

    Wrapper.__new__(Wrapper).init_worker()
    Core()
    seen.append(processes_here())
    assert seen == [{patches.Process.WORKER}, {patches.Process.ENGINE_CORE},
                    {patches.Process.API_SERVER}]
