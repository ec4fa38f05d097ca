"""The shared-GPU shim (benchmarks/gpu_kit/shared_gpu): PP=2 on a one-GPU machine.

Each check runs a fresh interpreter with the shim on ``PYTHONPATH``, as the GPU
kit runs it, against the real vLLM installed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "benchmarks" / "gpu_kit" / "shared_gpu"

PROBE = r"""
import json, os
from vllm.engine.arg_utils import EngineArgs
chosen = EngineArgs(model="m", pipeline_parallel_size=2)
kept = EngineArgs(model="m", pipeline_parallel_size=2, distributed_executor_backend="ray",
                  kv_cache_memory_bytes=123)
from vllm.config import ParallelConfig
config = ParallelConfig(pipeline_parallel_size=2, distributed_executor_backend="mp")
gpus = {}
for rank in (0, 1):
    gpus[rank] = [config.get_local_gpu_index(rank), os.environ["NCCL_HOSTID"]]
print("RESULT" + json.dumps({
    "chosen": [chosen.distributed_executor_backend, chosen.kv_cache_memory_bytes],
    "kept": [kept.distributed_executor_backend, kept.kv_cache_memory_bytes],
    "gpus": gpus, "ifname": os.environ.get("NCCL_SOCKET_IFNAME"),
}))
"""


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KIT_SHARED_GPU")}
    environ.pop("NCCL_SOCKET_IFNAME", None)
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(ROOT / "src"),
                                             environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=600)


def _has_local_gpu_index() -> bool:
    from vllm.config import ParallelConfig

    return hasattr(ParallelConfig, "get_local_gpu_index")


def test_without_the_setting_the_shim_changes_nothing():
    proc = _run("import vllm_pp_cudagraph, sitecustomize, sys;"
                "from vllm.engine.arg_utils import EngineArgs;"
                "a = EngineArgs(model='m', pipeline_parallel_size=2);"
                "print('RESULT', a.distributed_executor_backend, a.kv_cache_memory_bytes,"
                " sitecustomize.STAGES, len([f for f in sys.meta_path"
                " if type(f).__name__ == '_PatchAfterImport']))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT None None 0 0" in proc.stdout
    assert "[shared-gpu]" not in proc.stderr


@pytest.mark.skipif(not _has_local_gpu_index(), reason="this vLLM predates get_local_gpu_index")
def test_both_stages_map_to_gpu_0_with_host_ids_of_their_own():
    proc = _run(PROBE, KIT_SHARED_GPU_STAGES="2", KIT_SHARED_GPU_KV_GIB="2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    # the executor and a fixed KV cache where unset; what the caller set is kept
    assert result["chosen"] == ["mp", 2 * 2**30]
    assert result["kept"] == ["ray", 123]
    # one GPU, and NCCL told the stages are on different hosts (its duplicate-GPU check)
    assert result["gpus"] == {"0": [0, "shared-gpu-stage-0"], "1": [0, "shared-gpu-stage-1"]}
    assert result["ifname"] == "lo"
    assert "[shared-gpu]" in proc.stderr


@pytest.mark.skipif(_has_local_gpu_index(), reason="this vLLM has get_local_gpu_index")
def test_a_vllm_without_the_hook_is_refused_naming_the_setting():
    proc = _run("import vllm.config.parallel", KIT_SHARED_GPU_STAGES="2")
    assert proc.returncode != 0
    assert "unset KIT_SHARED_GPU_STAGES" in proc.stderr


def test_the_bench_counts_the_shared_stages_only_where_a_gpu_is_visible():
    proc = _run("from vllm_pp_cudagraph.commands.bench import cli;"
                "import torch; torch.cuda.device_count = lambda: 1;"
                "torch.cuda.is_available = lambda: True; print('RESULT', cli.visible_gpus())",
                KIT_SHARED_GPU_STAGES="2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "RESULT 2" in proc.stdout
    none = _run("from vllm_pp_cudagraph.commands.bench import cli; import torch;"
                "torch.cuda.is_available = lambda: False; print('RESULT', cli.visible_gpus())",
                KIT_SHARED_GPU_STAGES="2")
    assert "RESULT 0" in none.stdout, none.stderr[-2000:]


RAY_PROBE = r"""
import json, os
import vllm.v1.executor.ray_utils as ray_utils
from vllm.config import ParallelConfig

calls = []

class FakeRay:
    def __init__(self):
        self.up = False
    def is_initialized(self):
        return self.up
    def init(self, **kwargs):
        calls.append({"kwargs": {k: v for k, v in kwargs.items() if k != "runtime_env"},
                      "visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
        self.up = True

ray_utils.ray = FakeRay()
ray_utils.ray_import_err = None
config = ParallelConfig(pipeline_parallel_size=2, distributed_executor_backend="ray")
try:
    ray_utils.initialize_ray_cluster(config)
except Exception as e:  # vLLM's own cluster checks, past the shim's part
    calls.append({"then": type(e).__name__})
print("RESULT" + json.dumps({"calls": calls,
                             "visible_after": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


@pytest.mark.skipif(not _has_local_gpu_index(), reason="this vLLM predates get_local_gpu_index")
def test_under_ray_the_local_cluster_counts_a_gpu_per_stage():
    """Ray refuses a cluster of more GPUs than CUDA_VISIBLE_DEVICES lists, so the
    shim starts it without that variable, and puts it back for the engine."""
    proc = _run(RAY_PROBE, KIT_SHARED_GPU_STAGES="2", CUDA_VISIBLE_DEVICES="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["calls"][0] == {"kwargs": {"num_gpus": 2}, "visible": None}
    assert result["visible_after"] == "0"


TP_PROBE = r"""
import json, os
from vllm.engine.arg_utils import EngineArgs
tp = EngineArgs(model="m", pipeline_parallel_size=2, tensor_parallel_size=2)
pp = EngineArgs(model="m", pipeline_parallel_size=2)
print("RESULT" + json.dumps({
    "tp": [tp.disable_custom_all_reduce, tp.compilation_config.pass_config.fuse_allreduce_rms],
    "pp": [pp.disable_custom_all_reduce, pp.compilation_config.pass_config.fuse_allreduce_rms],
    "env": [os.environ.get(n) for n in ("VLLM_ALLREDUCE_USE_FLASHINFER",
                                        "VLLM_ALLREDUCE_USE_SYMM_MEM")],
}))
"""


@pytest.mark.skipif(not _has_local_gpu_index(), reason="this vLLM predates get_local_gpu_index")
def test_under_tp_all_reduce_is_left_to_nccl():
    """Custom, FlashInfer and symmetric-memory all-reduce and the fused all-reduce +
    RMSNorm set up CUDA IPC between the TP ranks' GPUs; with every rank on one GPU that
    stalled an engine's start-up for minutes and then killed it."""
    proc = _run(TP_PROBE, KIT_SHARED_GPU_STAGES="4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["tp"] == [True, False]
    assert result["pp"][0] is False  # without TP, vLLM's own choice stays
    assert result["env"] == ["0", "0"]
    assert "all-reduce by NCCL alone" in proc.stderr
