"""Test-only: run every stage of a PP engine on the one GPU of a one-GPU machine.

vLLM gives each pipeline stage a GPU of its own, and NCCL refuses two ranks on one
GPU ("Duplicate GPU detected"). Where only one-GPU machines are at hand, this
module lets a PP=N engine start anyway, so that what does not depend on the stages
having GPUs of their own (graph capture per stage, the stage hand-off, the tokens)
can be checked. Speed measured this way means nothing: the stages share one GPU's
time, and their NCCL traffic goes over a loopback socket.

Active only with ``KIT_SHARED_GPU_STAGES=N`` (N >= 2) in the environment, and only
on vLLM releases with ``ParallelConfig.get_local_gpu_index`` (0.33). It is found as
``sitecustomize`` through ``PYTHONPATH``, so every process of the engine runs it:

- engine arguments: the multiprocess executor (vLLM would otherwise refuse a world
  size above the GPU count) and a fixed KV cache of ``KIT_SHARED_GPU_KV_GIB`` GiB
  (default 4) per stage, as vLLM's memory profiling assumes no other process
  allocates on its GPU meanwhile; with TP, all-reduce by NCCL alone (custom,
  FlashInfer and symmetric-memory all-reduce and the all-reduce + RMSNorm fusion
  share buffers between GPUs over CUDA IPC);
- each worker: GPU index 0, and an NCCL host id of its own (``NCCL_HOSTID``), which
  is what NCCL's duplicate-GPU check compares; NCCL then connects the stages as if
  they were on two hosts, over ``lo``;
- the bench's GPU count (``vllm_pp_cudagraph.commands.bench.cli.visible_gpus``): N;
- with ``--distributed-executor-backend ray``, the local Ray cluster vLLM starts
  counts N GPUs, so its placement group has a bundle per stage. It starts without
  ``CUDA_VISIBLE_DEVICES`` (Ray refuses more GPUs than that lists), and its workers
  run this module too, so they map to GPU 0 as above.

Each patched process prints one line to stderr saying what it changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

STAGES = int(os.environ.get("KIT_SHARED_GPU_STAGES", "0") or 0)


def _say(what: str) -> None:
    print(f"[shared-gpu] pid {os.getpid()}: {what}", file=sys.stderr, flush=True)


def _patch_engine_args(module) -> None:
    cls = module.EngineArgs
    original = cls.__post_init__
    kv_bytes = int(float(os.environ.get("KIT_SHARED_GPU_KV_GIB", "4")) * 2**30)

    def __post_init__(self):
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "mp"
        if self.kv_cache_memory_bytes is None:
            self.kv_cache_memory_bytes = kv_bytes
        tp = self.tensor_parallel_size > 1
        if tp:
            # custom all-reduce maps its peers' buffers over CUDA IPC between GPUs
            self.disable_custom_all_reduce = True
        _say(f"engine args: executor {self.distributed_executor_backend}, "
             f"KV cache {self.kv_cache_memory_bytes / 2**30:g} GiB per stage"
             + (", all-reduce by NCCL alone, no all-reduce + RMSNorm fusion" if tp else ""))
        original(self)
        if tp:
            # FlashInfer's fused all-reduce sets up a CUDA IPC workspace between the TP
            # ranks' GPUs: with every rank on one GPU that start-up stalls for minutes
            # and the engine then dies.
            self.compilation_config.pass_config.fuse_allreduce_rms = False

    cls.__post_init__ = __post_init__


def _patch_parallel_config(module) -> None:
    cls = module.ParallelConfig
    if not hasattr(cls, "get_local_gpu_index"):
        raise RuntimeError(
            "KIT_SHARED_GPU_STAGES: this vLLM has no ParallelConfig.get_local_gpu_index "
            "(0.33 has); unset KIT_SHARED_GPU_STAGES")

    def get_local_gpu_index(self, local_rank: int, dp_local_rank: int | None = None) -> int:
        host_id = f"shared-gpu-stage-{local_rank}"
        if os.environ.get("NCCL_HOSTID") != host_id:
            os.environ["NCCL_HOSTID"] = host_id
            _say(f"local rank {local_rank} on GPU 0, NCCL_HOSTID={host_id}")
        return 0

    cls.get_local_gpu_index = get_local_gpu_index


def _patch_bench_cli(module) -> None:
    real = module.visible_gpus

    def visible_gpus() -> int:
        gpus = real()
        return STAGES if gpus >= 1 else gpus

    module.visible_gpus = visible_gpus
    _say(f"bench: {STAGES} stages share GPU 0")


def _patch_ray_utils(module) -> None:
    original = module.initialize_ray_cluster

    def initialize_ray_cluster(parallel_config, ray_address=None):
        ray = module.ray
        if ray is not None and ray_address is None and not ray.is_initialized():
            visible = os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            try:
                ray.init(num_gpus=STAGES, runtime_env=parallel_config.ray_runtime_env)
            finally:
                if visible is not None:
                    os.environ["CUDA_VISIBLE_DEVICES"] = visible
            _say(f"ray: a local cluster of {STAGES} GPUs, all GPU 0")
        return original(parallel_config, ray_address)

    module.initialize_ray_cluster = initialize_ray_cluster


PATCHES = {
    "vllm.engine.arg_utils": _patch_engine_args,
    "vllm.config.parallel": _patch_parallel_config,
    "vllm.v1.executor.ray_utils": _patch_ray_utils,
    "vllm_pp_cudagraph.commands.bench.cli": _patch_bench_cli,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules in PATCHES through the other finders, patching each once loaded."""

    def __init__(self) -> None:
        self._loaders: dict = {}

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loaders[name] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        self._loaders[module.__name__].exec_module(module)
        PATCHES[module.__name__](module)


if STAGES >= 2:
    for _name in ("VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_ALLREDUCE_USE_SYMM_MEM"):
        os.environ.setdefault(_name, "0")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")
    sys.meta_path.insert(0, _PatchAfterImport())
