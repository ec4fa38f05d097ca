"""End-to-end checks on GPUs: the plugin inside a real PP=2 vLLM engine.

Skipped where no CUDA device is visible; results of runs on 2x H200 are in
benchmarks/results/.
"""

from __future__ import annotations

import pytest
import torch

from vllm_pp_cudagraph.bench.engine_run import RunSpec, run_in_subprocess

pytestmark = pytest.mark.gpu


def _need_gpus(n: int) -> None:
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs")


def test_plugin_runner_on_every_pp_rank_and_tokens_match_stock(tmp_path):
    _need_gpus(2)
    plugin = run_in_subprocess(RunSpec("plugin", "piecewise", output_len=64), tmp_path / "p.log", timeout_s=600)
    stock = run_in_subprocess(RunSpec("stock", "piecewise", output_len=64), tmp_path / "s.log", timeout_s=600)
    assert plugin["returncode"] == 0, plugin.get("error_tail")
    log = (tmp_path / "p.log").read_text()
    for stage in (0, 1):
        assert f"PPCudaGraphModelRunner on pipeline stage {stage} of 2" in log
    assert plugin["digest"] == stock["digest"]
    # The report names what it ran on, so results from other releases are not mixed up.
    assert plugin["spec"]["vllm_version"] and plugin["spec"]["torch_version"]
    assert plugin["spec"]["gpu"] == torch.cuda.get_device_name(0)


def test_serving_smoke_against_stock(tmp_path):
    """A small version of tests/e2e/serve_soak.py (the full run is committed
    under benchmarks/results/)."""
    _need_gpus(2)
    from tests.e2e.serve_soak import main

    assert main(["--out", str(tmp_path), "--modes", "piecewise", "--requests", "200",
                 "--concurrency", "64", "--refusals"]) == 0
