"""Shared fixtures. Tests run against the installed vLLM, on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
PLUGIN_ENV_PREFIXES = ("VLLM_PP_CUDAGRAPH_",)
PLUGIN_ENV_NAMES = ("VLLM_PLUGINS", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH")


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key in PLUGIN_ENV_NAMES or key.startswith(PLUGIN_ENV_PREFIXES):
            monkeypatch.delenv(key)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No plugin-related variables set; patches undone afterwards."""
    from vllm_pp_cudagraph import patches

    _clean_env(monkeypatch)
    yield monkeypatch
    patches.undo_all()


def run_python(script: str, env_overrides: dict[str, str | None]) -> tuple[dict, str]:
    """Run ``script`` in a fresh interpreter (vLLM loads plugins once per process).

    The script prints one JSON object on its last stdout line; returns it and
    everything else the process printed (vLLM logs to stdout).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in PLUGIN_ENV_NAMES and not k.startswith(PLUGIN_ENV_PREFIXES)
    }
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    *log, report = proc.stdout.strip().splitlines()
    return json.loads(report), "\n".join(log) + "\n" + proc.stderr


def pytest_addoption(parser):
    parser.addoption(
        "--graph-modes", default="",
        help="GPU layout checks: run only these graph modes, comma-separated (the first "
             "takes stock's control engine); default every mode the layout lists")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip themselves where no CUDA device is visible."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pp_group():
    """vLLM's real distributed state for one CPU process (gloo), PP size 1."""
    import socket

    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        get_pp_group,
        init_distributed_environment,
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )
        ensure_model_parallel_initialized(1, 1)
    return get_pp_group()


class NoGraphPoolPlatform:
    """CPU stand-in for the CUDA platform's graph-pool lookup (no GPU here)."""

    @staticmethod
    def get_global_graph_pool():
        return None


@pytest.fixture
def make_manager(pp_group, monkeypatch):
    """Build the plugin's real PPCudaGraphManager on CPU for a given shape config."""
    import torch
    import vllm.v1.worker.gpu.cudagraph_utils as cgu
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode

    from vllm_pp_cudagraph.worker.graphs.cudagraph_manager import PPCudaGraphManager

    monkeypatch.setattr(cgu, "current_platform", NoGraphPoolPlatform())

    def build(mode, capture_sizes, max_num_seqs, decode_query_len=1, cls=PPCudaGraphManager):
        config = VllmConfig(device_config=DeviceConfig(device="cpu"))
        config.scheduler_config.max_num_seqs = max_num_seqs
        config.compilation_config.cudagraph_capture_sizes = sorted(capture_sizes)
        config.compilation_config.max_cudagraph_capture_size = max(capture_sizes)
        return cls(config, torch.device("cpu"), CUDAGraphMode[mode], decode_query_len)

    return build


@pytest.fixture(autouse=True)
def _settings_read_afresh(monkeypatch):
    """Each test's environment is read as a new process would read it."""
    from vllm_pp_cudagraph.shared import settings
    from vllm_pp_cudagraph.shared import snapshots

    monkeypatch.setattr(settings, "_current", None)
    monkeypatch.setattr(settings, "_hand_set", settings._UNREAD)
    monkeypatch.setattr(snapshots, "_made_here", None)
