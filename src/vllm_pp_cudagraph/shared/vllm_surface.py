"""The vLLM names the plugin uses (:data:`SURFACE`, checked by :func:`missing_surface`), and
probes that tell releases apart by what they contain, never by version number."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig

#: Releases this plugin is tested against: lower bound inclusive, upper exclusive.
SUPPORTED_MIN = (0, 29, 0)
SUPPORTED_BELOW = (0, 34, 0)
SUPPORTED_RANGE = ">=0.29.0,<0.34"
#: MRV2's runner; up to 0.31 the worker imports its ``GPUModelRunner`` inline.
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
#: The GPU worker, and its method that builds the model runner (0.32+).
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
RUNNER_FACTORY = "_make_model_runner"
#: Modules whose attention ops are decorated for breakable graphs at import time.
BREAKABLE_DECORATED_MODULES = ("vllm.model_executor.layers.attention.attention",)
VLLM_CONFIG_MODULE = "vllm.config.vllm"
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
MESSAGE_QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
PARALLEL_STATE_MODULE = "vllm.distributed.parallel_state"
#: The (non-MLA) KV-cache-write op vLLM splits piecewise graphs at.
KV_CACHE_UPDATE_OP = "vllm::unified_kv_cache_update"
#: vLLM's layers per pipeline stage, read by ``get_pp_indices`` through ``vllm.envs``.
LAYER_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
#: The scheduler's admission queues: ``skipped_waiting`` up to 0.30, ``kv_holding_waiting`` after.
WAITING_QUEUE_NAMES = ("waiting", "skipped_waiting", "kv_holding_waiting")
#: The registration of MRV2's top-k/top-p Triton kernels for JIT warm-up (0.33).
SAMPLING_WARM_UPS = ("vllm.v1.sample.ops.topk_topp_sampler", "register_top_k_top_p_warmups")


def vllm_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """``get_pp_indices``'s split without ``VLLM_PP_LAYER_PARTITION``, which vLLM reads through
    a cache (a test holds the two equal); for the split in effect, call ``get_pp_indices``."""
    split = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        split[-i] += 1
    return tuple(split)


@dataclass(frozen=True)
class Needed:
    """A vLLM name the plugin needs: ``members``, ``instance_attrs`` set in its source."""

    module: str
    name: str
    members: tuple[str, ...] = ()
    instance_attrs: tuple[str, ...] = ()
    used_where: str | None = None  # a probe: where it answers falsy, skip this need


SURFACE: tuple[Needed, ...] = (
    Needed(V2_RUNNER_MODULE, "GPUModelRunner",
           members=("load_model", "profile_run", "profile_cudagraph_memory", "initialize_kv_cache",
                    "capture_model", "execute_model", "prepare_inputs",
                    "update_pp_decode_requests", "postprocess_sampled", "_dummy_sampler_run"),
           instance_attrs=("intermediate_tensors", "cudagraph_manager", "pp_handler", "req_states",
                           "model", "model_config", "parallel_config", "compilation_config",
                           "vllm_config", "device", "is_first_pp_rank", "is_last_pp_rank",
                           "use_pp", "max_num_reqs", "input_buffers", "model_state",
                           "speculative_config")),
    Needed("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager",
           members=("capture", "dispatch", "needs_capture", "_init_candidates",
                    "init_breakable_cg_runner", "run_pw_graph"),
           instance_attrs=("_capture_descs", "_candidates", "_graphs_captured", "graphs", "pool",
                           "breakable_cg_runner", "use_breakable_cg", "max_num_reqs",
                           "vllm_config", "device", "cudagraph_mode")),
    Needed(V2_RUNNER_MODULE, "ModelCudaGraphManager"),  # what managers_built_as replaces
    Needed("vllm.v1.worker.gpu.cudagraph_utils", "BatchExecutionDescriptor",
           members=("num_tokens", "num_reqs", "cg_mode", "uniform_token_count",
                    "num_active_loras")),
    Needed("vllm.v1.worker.gpu.pp_utils", "PPHandler", members=("get_prev_sampled_outputs",),
           instance_attrs=("queue", "req_idx_gen_np", "is_last_rank")),
    Needed("vllm.v1.worker.gpu.pp_utils", "PendingRecv",
           members=("idx_mapping_np", "gen_at_receive_np", "need_sampled_mask")),
    Needed("vllm.compilation.breakable_cudagraph", "BreakableCUDAGraphWrapper",
           members=("clear_graphs",), instance_attrs=("graph_pool",)),
    Needed("vllm.compilation.breakable_cudagraph", "is_breakable_cudagraph_enabled"),
    Needed("vllm.compilation.breakable_cudagraph", "eager_break_during_capture"),
    Needed("vllm.v1.core.sched.async_scheduler", "AsyncScheduler",
           members=("schedule", "_update_after_schedule", "_update_request_with_output"),
           instance_attrs=("running", "requests", "current_step", "pp_size", "vllm_config",
                           "use_v2_model_runner", "num_spec_tokens", "max_num_running_reqs",
                           "waiting", "_pause_state", "num_waiting_for_streaming_input")),
    Needed("vllm.v1.request", "Request", members=("use_structured_output", "num_output_tokens"),
           instance_attrs=("next_decode_eligible_step", "num_output_placeholders", "max_tokens",
                           "is_prefill_chunk")),
    Needed("vllm.v1.core.sched.output", "SchedulerOutput", members=("scheduled_cached_reqs",)),
    Needed("vllm.v1.core.sched.output", "CachedRequestData",
           members=("req_ids", "resumed_req_ids")),
    Needed("vllm.v1.worker.gpu.states", "RequestState", instance_attrs=("req_id_to_index",)),
    Needed("vllm.v1.worker.gpu.model_states.interface", "ModelState",
           members=("prepare_dummy_inputs",)),
    # vLLM's table of VLLM_* variables, which the env-names patch extends for environ_check.
    Needed("vllm", "envs"), Needed("vllm.envs", "environment_variables"),
    # The layer partition is read through vllm.envs.__getattr__ (cached by enable_envs_cache).
    Needed("vllm.envs", "__getattr__"), Needed("vllm.distributed.utils", "get_pp_indices"),
    Needed("vllm.config", "ModelConfig",
           members=("get_total_num_hidden_layers", "get_layers_start_end_indices"),
           instance_attrs=("hf_text_config", "dtype", "quantization")),
    Needed("vllm.config", "ParallelConfig",
           instance_attrs=("pipeline_parallel_size", "_api_process_rank")),
    Needed("vllm.config", "SchedulerConfig", members=("get_scheduler_cls",),
           instance_attrs=("max_num_seqs", "max_num_batched_tokens")),
    Needed("vllm.config", "CacheConfig",
           instance_attrs=("gpu_memory_utilization", "kv_cache_memory_bytes")),
    Needed("vllm.model_executor.warmup.jit_warmup", "JitWarmupRegistry",
           members=("activate", "register", "warmup", "__len__")),
    Needed("vllm.model_executor.models.interfaces", "EagleModelMixin"),
    Needed("vllm.model_executor.models.interfaces", "SupportsPP",
           members=("make_empty_intermediate_tensors",)),
    Needed("vllm.config.compilation", "CompilationConfig", members=("set_splitting_ops_for_v1",),
           instance_attrs=("splitting_ops", "cudagraph_mode")),
    Needed(WORKER_MODULE, "Worker", members=(RUNNER_FACTORY,), used_where="worker_runner_factory"),
    Needed("vllm.v1.executor.abstract", "Executor", members=("collective_rpc", "shutdown")),
    Needed(VLLM_CONFIG_MODULE, "VllmConfig", members=("__post_init__", "use_v2_model_runner")),
    Needed(ENGINE_CORE_MODULE, "EngineCore", members=("_initialize_kv_caches",),
           instance_attrs=("model_executor", "vllm_config")),
    Needed("vllm.v1.core.sched.interface", "PauseState", members=("UNPAUSED",)),
    Needed("vllm.sequence", "IntermediateTensors", members=("tensors",)),
    Needed(MESSAGE_QUEUE_MODULE, "MessageQueue", members=("dequeue", "shutdown"),
           instance_attrs=("_is_local_reader", "_is_remote_reader", "remote_socket",
                           "shutting_down")),
    Needed(PARALLEL_STATE_MODULE, "GroupCoordinator",
           members=("isend_tensor_dict", "irecv_tensor_dict", "_should_use_all_gather",
                    "all_gather"),
           instance_attrs=("cpu_group", "device_group", "ranks", "rank_in_group", "world_size",
                           "use_cpu_custom_send_recv")),
    Needed("vllm.v1.worker.gpu.input_batch", "InputBatch", members=("num_tokens_after_padding",)),
    Needed(PARALLEL_STATE_MODULE, "get_pp_group"), Needed(PARALLEL_STATE_MODULE, "get_tp_group"),
    Needed(PARALLEL_STATE_MODULE, "get_pcp_group"), Needed(PARALLEL_STATE_MODULE, "graph_capture"),
    Needed("vllm.forward_context", "set_forward_context"),
    Needed("vllm.utils.torch_utils", "_USE_LAYERNAME"),
    Needed("vllm.logger", "init_logger"), Needed("vllm.config", "VllmConfig"),
    Needed("vllm.config", "CompilationMode", members=("VLLM_COMPILE",)),
    Needed("vllm.config.compilation", "CUDAGraphMode",
           members=("NONE", "FULL", "mixed_mode", "decode_mode", "separate_routine")),
    Needed("vllm.v1.kv_cache_interface", "KVCacheConfig"),
    Needed("vllm.v1.metrics.loggers", "StatLoggerBase",
           members=("record", "log", "log_engine_initialized")),
    Needed("vllm.v1.metrics.prometheus", "get_prometheus_registry"),
    # What the bench drives: vLLM's public offline API.
    Needed("vllm", "LLM"), Needed("vllm", "SamplingParams"), Needed("vllm.inputs", "TokensPrompt"),
    Needed("vllm.config", "ProfilerConfig"),
)


def _assigned_in_source(cls: type, attr: str) -> bool:
    pattern = re.compile(rf"self\.{re.escape(attr)}\s*(:[^=\n]*)?=")
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("vllm_pp_cudagraph"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if pattern.search(source) or re.search(rf"^\s+{re.escape(attr)}\s*:", source, re.M):
            return True
    return False


def missing_surface(surface: tuple[Needed, ...] = SURFACE) -> list[str]:
    """What of ``surface`` the installed vLLM lacks, one line per name."""
    missing = []
    for need in surface:
        if need.used_where is not None and not globals()[need.used_where]():
            continue
        try:
            module = importlib.import_module(need.module)
        except ImportError as exc:
            missing.append(f"{need.module}: cannot import ({exc})")
            continue
        where = f"{need.module}.{need.name}"
        if (obj := getattr(module, need.name, None)) is None:
            missing.append(where)
            continue
        missing += [f"{where}.{member}" for member in need.members
                    if not hasattr(obj, member)
                    and not (isinstance(obj, type) and _assigned_in_source(obj, member))]
        missing += [f"{where}: instance attribute {attr}"
                    for attr in need.instance_attrs if not _assigned_in_source(obj, attr)]
    return missing


@dataclass(frozen=True)
class VersionInfo:
    """The installed vLLM (and torch) version and whether the plugin supports it."""

    vllm: str | None
    torch: str | None

    @property
    def installed(self) -> bool:
        return self.vllm is not None

    @property
    def supported(self) -> bool:
        release = parse_release(self.vllm) if self.vllm else None
        return release is not None and SUPPORTED_MIN <= release < SUPPORTED_BELOW


def parse_release(version: str) -> tuple[int, int, int] | None:
    """``'0.33.1.dev3+gabc'`` -> ``(0, 33, 1)``; a pre-release counts as its release."""
    if (match := re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", version)) is None:
        return None
    return int(match[1]), int(match[2]), int(match[3] or 0)


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions() -> VersionInfo:
    """Read versions from package metadata, without importing vLLM or torch."""
    return VersionInfo(vllm=dist_version("vllm"), torch=dist_version("torch"))


@functools.cache
def _params(fn: Callable) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(fn).parameters


def environ_check() -> tuple[object, str]:
    """Where vLLM checks the ``VLLM_*`` variables set: on ``Platform`` (0.33) or ``vllm.envs``."""
    platform_cls = importlib.import_module("vllm.platforms.interface").Platform
    if "validate_environ" in vars(platform_cls):
        return platform_cls, "validate_environ"
    return importlib.import_module("vllm.envs"), "validate_environ"


def worker_runner_factory() -> tuple[type, str] | None:
    """The worker class and its model-runner factory (0.32+); None where it builds MRV2 inline."""
    worker_cls = importlib.import_module(WORKER_MODULE).Worker
    return (worker_cls, RUNNER_FACTORY) if hasattr(worker_cls, RUNNER_FACTORY) else None


@contextlib.contextmanager
def managers_built_as(manager_cls: type) -> Iterator[None]:
    """Within the block, MRV2's ``initialize_kv_cache`` builds ``manager_cls`` instead."""
    module = importlib.import_module(V2_RUNNER_MODULE)
    original, module.ModelCudaGraphManager = module.ModelCudaGraphManager, manager_cls
    try:
        yield
    finally:
        module.ModelCudaGraphManager = original


def prev_sampled_outputs(handler: Any, draft_tokens: Any = None) -> dict | None:
    """``PPHandler.get_prev_sampled_outputs``, passing draft tokens where it takes them (0.30+)."""
    method = handler.get_prev_sampled_outputs
    function = getattr(method, "__func__", method)
    if draft_tokens is not None and "draft_tokens_to_update" in _params(function):
        return method(draft_tokens)
    return method()


def api_server_rank(vllm_config: VllmConfig) -> int:
    """This process's rank among ``--api-server-count N`` API servers (0 for one; cores: -1)."""
    return getattr(vllm_config.parallel_config, "_api_process_rank", 0)


@functools.cache
def breakable_decided_at_import() -> bool:
    """Whether vLLM's breakable decorator reads its switch at import (to 0.32), not at call."""
    from vllm.compilation import breakable_cudagraph

    def probe() -> None:
        return None
    switch = breakable_cudagraph.is_breakable_cudagraph_enabled
    breakable_cudagraph.is_breakable_cudagraph_enabled = lambda: False
    try:
        return breakable_cudagraph.eager_break_during_capture(probe) is probe
    finally:
        breakable_cudagraph.is_breakable_cudagraph_enabled = switch


def waiting_queues(scheduler: object) -> list:
    return [q for name in WAITING_QUEUE_NAMES if (q := getattr(scheduler, name, None)) is not None]


def admission_cap(scheduler: object) -> int:
    """How many requests may run at once (``max_num_active_reqs`` from 0.31)."""
    return getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs)


def reread_vllm_env(name: str, value: str | None) -> None:
    """Clear ``vllm.envs``'s cache so vLLM reads ``name`` afresh; RuntimeError unless ``value``."""
    from vllm import envs
    if hasattr(envs.__getattr__, "cache_clear"):  # cached once enable_envs_cache ran
        envs.__getattr__.cache_clear()
    if getattr(envs, name) != value:
        raise RuntimeError(f"vLLM reads {name}={getattr(envs, name)!r} after it was set to "
                           f"{value!r} (vllm.envs changed; see vllm_surface.py)")


def asked_attention_backends(vllm_config: VllmConfig) -> set[str]:
    """The attention backends ``attention_config`` names (per-kind ones too), by name."""
    attention = getattr(vllm_config, "attention_config", None)
    asked = [getattr(attention, "backend", None),
             *(getattr(attention, "backend_per_kind", None) or {}).values()]
    return {getattr(b, "name", str(b)) for b in asked if b is not None}


def layer_names_are_hoisted() -> bool:
    """Whether custom ops take layer names as hoisted opaque values (torch >= 2.11)."""
    from vllm.utils import torch_utils
    return bool(getattr(torch_utils, "_USE_LAYERNAME", False))


def stage_reserved_key_prefixes() -> tuple[str, ...]:
    """Input-buffer key prefixes vLLM reserves on a receiving stage (EAGLE3's, 0.33+)."""
    from vllm.model_executor.models.interfaces import EagleModelMixin
    prefix = getattr(EagleModelMixin, "AUX_HIDDEN_STATE_KEY", None)
    return (prefix,) if prefix else ()


def register_sampling_warm_ups(registry: Any) -> bool:
    """Register vLLM's top-k/top-p kernels with ``registry`` (0.33+); False where either lacks."""
    module_name, name = SAMPLING_WARM_UPS
    try:
        register = getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return False
    if registry is None or register is None:
        return False
    # vLLM drops a registration it already holds (it makes this one with speculative decoding).
    with registry.activate():
        register()
    return True


def jit_warmup_registry(vllm_config: VllmConfig) -> Any:
    """A JIT warm-up registry of the plugin's own, apart from the runner's."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    return JitWarmupRegistry(vllm_config)
