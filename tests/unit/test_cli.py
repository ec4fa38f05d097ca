"""`vllm-pp-cudagraph check`: output and the exit codes the README states."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest

from vllm_pp_cudagraph import cli, compat


@pytest.fixture
def gpus(clean_env):
    """Two GPUs visible, unless a test says otherwise."""
    clean_env.setattr(cli, "_gpu_count", lambda: 2)
    return clean_env


def run_check() -> tuple[int, str]:
    out = io.StringIO()
    code = cli.check(out)
    return code, out.getvalue()


def test_supported_install_enabled(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert f"vLLM: {compat.installed_versions().vllm}" in out and "OK" in out
    assert "plugin ENABLED" in out
    assert "filters every other vLLM plugin" in out
    assert "v2-runner-class: applies  [vllm.v1.worker.gpu.model_runner.GPUModelRunner]" in out
    assert "breakable-env: stands aside: VLLM_PP_CUDAGRAPH_BREAKABLE is off" in out
    assert "GPUs visible: 2" in out


def test_no_gpu_visible_is_a_problem(gpus):
    gpus.setattr(cli, "_gpu_count", lambda: 0)
    code, out = run_check()
    assert code == cli.EXIT_NO_GPU
    assert "no NVIDIA GPU visible" in out


def test_unset_plugins_says_how_to_enable(gpus):
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "INACTIVE" in out and "Set VLLM_PLUGINS=pp_cudagraph" in out


def test_misspelt_plugin_name_exits_nonzero(gpus):
    gpus.setenv("VLLM_PLUGINS", "lora_filesystem_resolver, pp-cudagraph")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "INACTIVE" in out
    assert "' pp-cudagraph' is not the plugin's name; did you mean 'pp_cudagraph'" in out


def test_other_plugin_named_alone_is_not_a_misspelling(gpus):
    gpus.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "INACTIVE" in out


def test_unsupported_vllm_exits_nonzero(gpus):
    gpus.setattr(compat, "installed_versions", lambda: compat.VersionInfo("0.25.1", "2.10.0"))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "0.25.1" in out and "UNSUPPORTED" in out


def test_unsupported_vllm_with_the_override_is_allowed(gpus):
    gpus.setattr(compat, "installed_versions", lambda: compat.VersionInfo("0.40.0", "2.14.0"))
    gpus.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "1")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "allowed by VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1" in out
    assert "or set VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 to try anyway" not in out


def test_missing_vllm_exits_nonzero(gpus):
    gpus.setattr(compat, "installed_versions", lambda: compat.VersionInfo(None, None))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "not installed" in out


def test_invalid_setting_exits_nonzero(gpus):
    gpus.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "perhaps")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM='perhaps'" in out


def test_v1_runner_with_plugin_enabled_exits_nonzero(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    gpus.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_USE_V2_MODEL_RUNNER='0' selects the V1 runner" in out


def test_console_script_runs_and_reports_the_missing_gpu(clean_env):
    # pip puts console scripts beside the interpreter that installed the package
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    exe = shutil.which("vllm-pp-cudagraph", path=search)
    assert exe is not None
    proc = subprocess.run([exe, "check"], capture_output=True, text=True, timeout=300)
    import torch

    assert proc.returncode == (cli.EXIT_OK if torch.cuda.is_available() else cli.EXIT_NO_GPU)
    assert "vllm-pp-cudagraph" in proc.stdout and "GPUs visible" in proc.stdout
