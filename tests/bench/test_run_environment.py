"""Every run's spec in bench.json names the vLLM, torch and GPU model it ran with.

Results from different releases and machines sit side by side in
``benchmarks/results``; a report that does not say what it ran on cannot be
compared with another.
"""

import os
import stat
from importlib import metadata

from vllm_pp_cudagraph.commands.bench import engine_run
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, gpu_model, spec_record

# Prints one line per GPU index given with -i (all four without), as nvidia-smi does.
FAKE_NVIDIA_SMI = """#!/bin/sh
names="NVIDIA H200,NVIDIA H200,NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3"
ids=0,1,2,3
while [ $# -gt 0 ]; do [ "$1" = -i ] && ids=$2; shift; done
for i in $(echo "$ids" | tr , ' '); do echo "$names" | cut -d, -f$((i + 1)); done
"""


def _fake_nvidia_smi(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")


def test_gpu_model_is_read_for_the_visible_gpus_only(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_model() == "NVIDIA H200"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    assert gpu_model() == "NVIDIA H200, NVIDIA H100 80GB HBM3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_model() == "NVIDIA H200, NVIDIA H100 80GB HBM3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu_model() is None


def test_without_nvidia_smi_the_gpu_is_unknown_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_model() is None


def test_spec_record_keeps_the_spec_and_adds_what_it_ran_on(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    engine_run.run_environment.cache_clear()
    try:
        record = spec_record(RunSpec("plugin", "piecewise", pp=2))
    finally:
        engine_run.run_environment.cache_clear()
    assert RunSpec(**{k: v for k, v in record.items() if k in RunSpec.__dataclass_fields__}) == (
        RunSpec("plugin", "piecewise", pp=2)
    )
    assert record["vllm_version"] == metadata.version("vllm")
    assert record["torch_version"] == metadata.version("torch")
    assert record["gpu"] == "NVIDIA H100 80GB HBM3"
