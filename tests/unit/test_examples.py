"""The examples refuse cleanly, on this CPU machine, when what they need is missing.

Each runs as a user runs it, in its own process: exit status not 0, one message on
stderr naming what is missing, no traceback.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PY_EXAMPLES = ["offline_pp2.py", "direct_runner.py"]  # the two that start an engine


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("VLLM", "VLLM_PLUGINS", "PORT")}
    # No GPU, whatever this machine has; nothing from the network should it get that far.
    base.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    return subprocess.run(args, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60, cwd=EXAMPLES.parent)


def python(example: str, *args: str, flags: tuple[str, ...] = (), **env: str):
    return run([sys.executable, *flags, str(EXAMPLES / example), *args], env)


def refused(result: subprocess.CompletedProcess, phrase: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    assert phrase in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("example", [*PY_EXAMPLES, "openai_client.py"])
def test_help_needs_no_packages(example: str) -> None:
    # -S: no site-packages, so neither vLLM nor torch nor openai can be imported.
    result = python(example, "--help", flags=("-S",))
    assert result.returncode == 0, result.stderr
    assert f"python examples/{example}" in result.stdout


@pytest.mark.parametrize("example", PY_EXAMPLES)
def test_no_gpus(example: str) -> None:
    refused(python(example, "--load-format", "dummy"), "needs 2 NVIDIA GPUs")


@pytest.mark.parametrize("example", PY_EXAMPLES)
def test_missing_model_directory(example: str, tmp_path: Path) -> None:
    refused(python(example, str(tmp_path / "no-model")), f"{tmp_path / 'no-model'} does not exist")


@pytest.mark.parametrize("example", PY_EXAMPLES)
def test_no_vllm(example: str) -> None:
    refused(python(example, flags=("-S",), PYTHONPATH=""), 'pip install "vllm==0.33.0"')


@pytest.mark.parametrize("example", PY_EXAMPLES)
def test_no_plugin(example: str, tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    refused(python(example, flags=("-S",), PYTHONPATH=str(tmp_path)),
            "vllm-pp-cudagraph is not installed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_client_no_server() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = python("openai_client.py", "--url", url)
    refused(result, f"could not reach the server at {url}")
    assert "examples/serve_pp2.sh" in result.stderr


def test_client_no_openai() -> None:
    refused(python("openai_client.py", flags=("-S",), PYTHONPATH=""), "pip install openai")


def fake_bin(tmp_path: Path, gpus: int, vllm: bool = True) -> str:
    """A PATH whose nvidia-smi lists ``gpus`` GPUs, and whose vllm (if any) only says it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"nvidia-smi": "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n"
                                   for i in range(gpus)) + ("exit 0" if gpus else "exit 9")}
    if vllm:
        tools["vllm"] = "echo 'Traceback: the fake vllm ran' >&2; exit 1"
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    # The system's tools, without any real vllm.
    rest = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "vllm").exists()]
    return os.pathsep.join([str(bin_dir), *rest])


def serve(tmp_path: Path, *args: str, gpus: int = 2, vllm: bool = True):
    return run(["bash", str(EXAMPLES / "serve_pp2.sh"), *args],
               {"PATH": fake_bin(tmp_path, gpus, vllm), "PORT": str(free_port())})


def test_serve_help(tmp_path: Path) -> None:
    result = serve(tmp_path, "--help")
    assert result.returncode == 0, result.stderr
    assert "examples/serve_pp2.sh [MODEL]" in result.stdout


def test_serve_no_gpus(tmp_path: Path) -> None:
    refused(serve(tmp_path, gpus=0), "needs 2 NVIDIA GPUs")


def test_serve_no_vllm(tmp_path: Path) -> None:
    refused(serve(tmp_path, vllm=False), 'pip install "vllm==0.33.0"')


def test_serve_missing_model_directory(tmp_path: Path) -> None:
    refused(serve(tmp_path, str(tmp_path / "no-model")), f"{tmp_path / 'no-model'} does not exist")
