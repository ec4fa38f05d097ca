"""`vllm-pp-cudagraph check`: output and exit codes."""

from __future__ import annotations

import io
import shutil
import subprocess

from vllm_pp_cudagraph import cli, compat


def run_check() -> tuple[int, str]:
    out = io.StringIO()
    code = cli.check(out)
    return code, out.getvalue()


def test_supported_install_enabled(clean_env):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "vLLM: 0.26" in out and "OK" in out
    assert "plugin ENABLED" in out
    assert "filters every other vLLM plugin" in out
    assert "v2-runner-class: vllm.v1.worker.gpu.model_runner.GPUModelRunner" in out
    assert "GPUs visible: 0" in out


def test_unset_plugins_says_how_to_enable(clean_env):
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "INACTIVE" in out and "Set VLLM_PLUGINS=pp_cudagraph" in out


def test_misspelt_plugin_name_is_pointed_out(clean_env):
    clean_env.setenv("VLLM_PLUGINS", "lora_filesystem_resolver, pp-cudagraph")
    code, out = run_check()
    assert "INACTIVE" in out
    assert "' pp-cudagraph' is not the plugin's name; did you mean 'pp_cudagraph'" in out


def test_unsupported_vllm_exits_nonzero(clean_env):
    clean_env.setattr(compat, "installed_versions", lambda: compat.VersionInfo("0.25.1", "2.10.0"))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "0.25.1" in out and "UNSUPPORTED" in out


def test_missing_vllm_exits_nonzero(clean_env):
    clean_env.setattr(compat, "installed_versions", lambda: compat.VersionInfo(None, None))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "not installed" in out


def test_invalid_setting_exits_nonzero(clean_env):
    clean_env.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "perhaps")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM='perhaps'" in out


def test_v1_runner_with_plugin_enabled_exits_nonzero(clean_env):
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    clean_env.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in out


def test_console_script_is_installed_and_runs(clean_env):
    exe = shutil.which("vllm-pp-cudagraph")
    assert exe is not None
    proc = subprocess.run([exe, "check"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "vllm-pp-cudagraph" in proc.stdout and "GPUs visible" in proc.stdout
