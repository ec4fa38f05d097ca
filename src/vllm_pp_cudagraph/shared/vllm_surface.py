"""The vLLM surface this plugin relies on, and how it differs between releases.

:data:`SURFACE` lists the vLLM names the package uses (:func:`missing_surface` checks
them); the probes tell releases apart by what they contain, never by version number."""

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

#: Module of MRV2's runner; up to 0.31 the worker imports its ``GPUModelRunner`` inline.
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
#: Module of the GPU worker, and its method that builds the model runner (0.32+).
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
RUNNER_FACTORY = "_make_model_runner"
#: Modules whose attention ops are decorated for breakable graphs at import time.
BREAKABLE_DECORATED_MODULES = ("vllm.model_executor.layers.attention.attention",)
#: Module of the scheduler used with async scheduling.
ASYNC_SCHEDULER_MODULE = "vllm.v1.core.sched.async_scheduler"
#: Module of ``VllmConfig``, whose construction picks the split points.
VLLM_CONFIG_MODULE = "vllm.config.vllm"
#: Module of the engine core, whose KV-cache set-up the engine check runs after.
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
#: Module of the message queues the executors read their workers' replies from.
MESSAGE_QUEUE_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
#: Module of the process groups, whose pipeline group passes tensors between stages.
PARALLEL_STATE_MODULE = "vllm.distributed.parallel_state"
#: The (non-MLA) KV-cache-write op vLLM splits piecewise graphs at.
KV_CACHE_UPDATE_OP = "vllm::unified_kv_cache_update"
#: vLLM's variable for the layers of each pipeline stage, read by ``get_pp_indices``
#: (through ``vllm.envs``) where a worker builds its model's layers (``make_layers``).
LAYER_PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


def vllm_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage under vLLM's default split: what ``get_pp_indices`` gives without
    ``VLLM_PP_LAYER_PARTITION`` (the remainder to the stages before the last, from the
    second-to-last back). Written out, because that function reads the variable through
    vLLM's environment cache, which a caller cannot set aside; a test holds the two equal.
    Where the split in effect is wanted, hand-set one included, call ``get_pp_indices``."""
    split = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        split[-i] += 1
    return tuple(split)


@dataclass(frozen=True)
class Needed:
    """One vLLM class or function the plugin relies on, and what of it: ``members`` of the
    object, ``instance_attrs`` assigned in its source, ``used_where`` a probe excusing them."""

    module: str
    name: str
    members: tuple[str, ...] = ()
    instance_attrs: tuple[str, ...] = ()
    used_where: str | None = None


SURFACE: tuple[Needed, ...] = (
    Needed(V2_RUNNER_MODULE, "GPUModelRunner",
           members=("load_model", "profile_run", "profile_cudagraph_memory",
                    "initialize_kv_cache", "capture_model", "execute_model", "prepare_inputs",
                    "update_pp_decode_requests", "postprocess_sampled"),
           instance_attrs=("intermediate_tensors", "cudagraph_manager", "pp_handler",
                           "req_states", "model", "model_config", "parallel_config",
                           "compilation_config", "vllm_config", "device", "is_first_pp_rank",
                           "is_last_pp_rank", "use_pp", "max_num_reqs", "input_buffers",
                           "model_state", "speculative_config")),
    Needed("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager",
           members=("capture", "dispatch", "needs_capture", "_init_candidates",
                    "init_breakable_cg_runner", "run_pw_graph"),
           instance_attrs=("_capture_descs", "_candidates", "_graphs_captured", "graphs",
                           "pool", "breakable_cg_runner", "use_breakable_cg", "max_num_reqs",
                           "vllm_config", "device", "cudagraph_mode")),
    # The name initialize_kv_cache builds its manager by (managers_built_as).
    Needed(V2_RUNNER_MODULE, "ModelCudaGraphManager"),
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
    Needed(ASYNC_SCHEDULER_MODULE, "AsyncScheduler",
           members=("schedule", "_update_after_schedule", "_update_request_with_output"),
           instance_attrs=("running", "requests", "current_step", "pp_size", "vllm_config",
                           "use_v2_model_runner", "num_spec_tokens", "max_num_running_reqs",
                           "waiting", "_pause_state", "num_waiting_for_streaming_input")),
    Needed("vllm.v1.request", "Request",
           members=("use_structured_output", "num_output_tokens"),
           instance_attrs=("next_decode_eligible_step", "num_output_placeholders",
                           "max_tokens", "is_prefill_chunk")),
    Needed("vllm.v1.core.sched.output", "SchedulerOutput", members=("scheduled_cached_reqs",)),
    Needed("vllm.v1.core.sched.output", "CachedRequestData",
           members=("req_ids", "resumed_req_ids")),
    Needed("vllm.v1.worker.gpu.states", "RequestState", instance_attrs=("req_id_to_index",)),
    Needed("vllm.v1.worker.gpu.model_states.interface", "ModelState",
           members=("prepare_dummy_inputs",)),
    # The table of VLLM_* variables vLLM knows; the env-names patch adds the plugin's for
    # vLLM's check of the environment (vllm_surface.environ_check) alone.
    Needed("vllm", "envs"),
    Needed("vllm.envs", "environment_variables"),
    # The layer partition: read through vllm.envs, whose __getattr__ enable_envs_cache caches.
    Needed("vllm.envs", "__getattr__"),
    Needed("vllm.distributed.utils", "get_pp_indices"),
    Needed("vllm.config", "ModelConfig",
           members=("get_total_num_hidden_layers", "get_layers_start_end_indices"),
           instance_attrs=("hf_text_config", "dtype", "quantization")),
    # Which of `vllm serve --api-server-count N`'s API servers a stat logger runs in.
    Needed("vllm.config", "ParallelConfig",
           instance_attrs=("pipeline_parallel_size", "_api_process_rank")),
    # The layer partition's KV-capacity rule: batch sizes and the KV cache's memory. The
    # engine plan asks which scheduler runs the engine (the cadence needs the async one).
    Needed("vllm.config", "SchedulerConfig", members=("get_scheduler_cls",),
           instance_attrs=("max_num_seqs", "max_num_batched_tokens")),
    Needed("vllm.config", "CacheConfig",
           instance_attrs=("gpu_memory_utilization", "kv_cache_memory_bytes")),
    # Its AUX_HIDDEN_STATE_KEY (0.33+) names the slots of EAGLE3 over PP; read if present.
    Needed("vllm.model_executor.models.interfaces", "EagleModelMixin"),
    Needed("vllm.model_executor.models.interfaces", "SupportsPP",
           members=("make_empty_intermediate_tensors",)),
    Needed("vllm.config.compilation", "CompilationConfig",
           members=("set_splitting_ops_for_v1",),
           # piecewise_split.py reads and writes the ops the piecewise graphs split at.
           instance_attrs=("splitting_ops", "cudagraph_mode")),
    # The runner factory the runner-factory patch wraps, where the worker has one (0.32+).
    Needed(WORKER_MODULE, "Worker", members=(RUNNER_FACTORY,),
           used_where="worker_runner_factory"),
    # The engine check asks every worker for its plan, and shuts them down on a refusal.
    Needed("vllm.v1.executor.abstract", "Executor", members=("collective_rpc", "shutdown")),
    Needed(VLLM_CONFIG_MODULE, "VllmConfig", members=("__post_init__", "use_v2_model_runner")),
    Needed(ENGINE_CORE_MODULE, "EngineCore", members=("_initialize_kv_caches",),
           instance_attrs=("model_executor", "vllm_config")),
    Needed("vllm.v1.core.sched.interface", "PauseState", members=("UNPAUSED",)),
    Needed("vllm.sequence", "IntermediateTensors", members=("tensors",)),
    # The remote-reply patch: how a reader on another node waits, and its shutdown flag.
    Needed(MESSAGE_QUEUE_MODULE, "MessageQueue", members=("dequeue", "shutdown"),
           instance_attrs=("_is_local_reader", "_is_remote_reader", "remote_socket",
                           "shutting_down")),
    Needed(PARALLEL_STATE_MODULE, "GroupCoordinator",
           members=("isend_tensor_dict", "irecv_tensor_dict", "_should_use_all_gather",
                    "all_gather"),
           instance_attrs=("cpu_group", "device_group", "ranks", "rank_in_group",
                           "world_size", "use_cpu_custom_send_recv")),
    Needed("vllm.v1.worker.gpu.input_batch", "InputBatch",
           members=("num_tokens_after_padding",)),
    Needed("vllm.distributed.parallel_state", "get_pp_group"),
    Needed("vllm.distributed.parallel_state", "get_tp_group"),
    Needed("vllm.distributed.parallel_state", "get_pcp_group"),
    Needed("vllm.distributed.parallel_state", "graph_capture"),
    Needed("vllm.forward_context", "set_forward_context"),
    Needed("vllm.utils.torch_utils", "_USE_LAYERNAME"),
    Needed("vllm.logger", "init_logger"),
    Needed("vllm.config", "VllmConfig"),
    Needed("vllm.config", "CompilationMode", members=("VLLM_COMPILE",)),
    Needed("vllm.config.compilation", "CUDAGraphMode",
           members=("NONE", "FULL", "mixed_mode", "decode_mode", "separate_routine")),
    Needed("vllm.v1.kv_cache_interface", "KVCacheConfig"),
    # Where the per-stage metrics reach /metrics (api_server/stat_logger.py).
    Needed("vllm.v1.metrics.loggers", "StatLoggerBase",
           members=("record", "log", "log_engine_initialized")),
    Needed("vllm.v1.metrics.prometheus", "get_prometheus_registry"),
    # What the bench drives: vLLM's public offline API.
    Needed("vllm", "LLM"),
    Needed("vllm", "SamplingParams"),
    Needed("vllm.inputs", "TokensPrompt"),
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
        obj = getattr(module, need.name, None)
        if obj is None:
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
    """``'0.33.0'``, ``'0.33.1.dev3+gabc'`` -> ``(0, 33, 0)`` / ``(0, 33, 1)``; a
    pre-release (``0.33.0rc1``) counts as its release."""
    match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (from its metadata), or None."""
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
    """Where vLLM checks the ``VLLM_*`` variables set against its table: the platform's
    ``validate_environ`` classmethod (0.33) or ``vllm.envs.validate_environ`` (earlier)."""
    platform_cls = importlib.import_module("vllm.platforms.interface").Platform
    if "validate_environ" in vars(platform_cls):
        return platform_cls, "validate_environ"
    return importlib.import_module("vllm.envs"), "validate_environ"


def worker_runner_factory() -> tuple[type, str] | None:
    """The worker class and its method that builds the model runner (0.32+), or None
    where the worker builds MRV2 inline (a function-local import of ``V2_RUNNER_MODULE``)."""
    worker_cls = importlib.import_module(WORKER_MODULE).Worker
    return (worker_cls, RUNNER_FACTORY) if hasattr(worker_cls, RUNNER_FACTORY) else None


@contextlib.contextmanager
def managers_built_as(manager_cls: type) -> Iterator[None]:
    """Within the block, MRV2's ``initialize_kv_cache`` builds ``manager_cls`` as its model
    CUDA-graph manager."""
    module = importlib.import_module(V2_RUNNER_MODULE)
    original = module.ModelCudaGraphManager
    module.ModelCudaGraphManager = manager_cls
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
    """This process's rank among ``vllm serve --api-server-count N``'s API servers (0 where
    there is one; vLLM gives engine cores -1 under that scale-out)."""
    return getattr(vllm_config.parallel_config, "_api_process_rank", 0)


@functools.cache
def breakable_decided_at_import() -> bool:
    """Whether vLLM's breakable decorator reads its switch when a module is imported (up
    to 0.32; from 0.33 it reads it at call time). Probed with the switch forced off."""
    from vllm.compilation import breakable_cudagraph

    def probe() -> None:
        return None

    switch = breakable_cudagraph.is_breakable_cudagraph_enabled
    breakable_cudagraph.is_breakable_cudagraph_enabled = lambda: False
    try:
        return breakable_cudagraph.eager_break_during_capture(probe) is probe
    finally:
        breakable_cudagraph.is_breakable_cudagraph_enabled = switch


#: The scheduler's queues of requests waiting for admission: ``waiting`` and
#: ``skipped_waiting`` up to 0.30; ``waiting`` and ``kv_holding_waiting`` from 0.31.
WAITING_QUEUE_NAMES = ("waiting", "skipped_waiting", "kv_holding_waiting")


def waiting_queues(scheduler: object) -> list:
    """The waiting queues this vLLM's scheduler has."""
    return [q for name in WAITING_QUEUE_NAMES if (q := getattr(scheduler, name, None)) is not None]


def admission_cap(scheduler: object) -> int:
    """How many requests may run at once: ``max_num_active_reqs`` from 0.31,
    ``max_num_running_reqs`` before."""
    return getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs)


def reread_vllm_env(name: str, value: str | None) -> None:
    """Have vLLM read its variable ``name`` afresh, after the plugin set it (settings.py),
    clearing ``vllm.envs``'s cache; RuntimeError if vLLM reads another value than ``value``."""
    from vllm import envs

    if hasattr(envs.__getattr__, "cache_clear"):  # cached once enable_envs_cache ran
        envs.__getattr__.cache_clear()
    if getattr(envs, name) != value:
        raise RuntimeError(f"vLLM reads {name}={getattr(envs, name)!r} after it was set to "
                           f"{value!r} (vllm.envs changed; see vllm_surface.py)")


def asked_attention_backends(vllm_config: VllmConfig) -> set[str]:
    """The attention backends named in ``vllm_config`` (``attention_config.backend`` and
    its per-kind overrides), by name; empty where vLLM chooses for every layer."""
    attention = getattr(vllm_config, "attention_config", None)
    asked = [getattr(attention, "backend", None),
             *(getattr(attention, "backend_per_kind", None) or {}).values()]
    return {getattr(b, "name", str(b)) for b in asked if b is not None}


def layer_names_are_hoisted() -> bool:
    """Whether custom ops take layer names as hoisted opaque values (torch >= 2.11)."""
    from vllm.utils import torch_utils

    return bool(getattr(torch_utils, "_USE_LAYERNAME", False))


def stage_reserved_key_prefixes() -> tuple[str, ...]:
    """Prefixes of the input-buffer keys vLLM reserves on a receiving stage itself
    (EAGLE3's ``aux_hidden_states_<i>``, 0.33+); empty where vLLM has none."""
    from vllm.model_executor.models.interfaces import EagleModelMixin

    prefix = getattr(EagleModelMixin, "AUX_HIDDEN_STATE_KEY", None)
    return (prefix,) if prefix else ()


#: Where MRV2 keeps the registration of its top-k/top-p Triton kernels for JIT warm-up (0.33).
SAMPLING_WARM_UPS = ("vllm.v1.sample.ops.topk_topp_sampler", "register_top_k_top_p_warmups")


def register_sampling_warm_ups(runner: Any) -> bool:
    """Add vLLM's top-k/top-p Triton kernels to ``runner``'s JIT warm-up registry (MRV2's
    ``jit_warmup_registry``, 0.33+), so that vLLM's own kernel warm-up compiles them
    before serving. False, registering nothing, where the release has no such warm-up."""
    registry = getattr(runner, "jit_warmup_registry", None)
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
