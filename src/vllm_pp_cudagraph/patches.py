"""Every change this plugin makes to vLLM, the only way to its subclasses (runner, CUDA-graph
manager); ``apply_for`` is re-entrant and ``undo_all`` restores vLLM exactly as it was."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.settings import (DecodeCadence, PluginConfigError,
                                               PPCudaGraphSettings, environment_value,
                                               plugin_variables_set, set_variable)

Undo = Callable[[], None]


class Process(str, Enum):
    """The kinds of process vLLM runs an engine in, each with its own patches."""

    API_SERVER = "API server"  # or the process of an offline LLM
    ENGINE_CORE = "engine core"
    WORKER = "worker"


EVERY_PROCESS = frozenset(Process)


@dataclass(frozen=True)
class Patch:
    """One documented modification of vLLM, applied only in ``processes``: ``apply`` returns
    its undo (None: nothing changed), ``stands_aside`` why not with these settings (None: it
    applies). A scoped patch has no ``apply``: the ``scope`` callable applies it later."""

    name: str
    target: str
    why: str
    drop_when: str
    processes: frozenset[Process]
    apply: Callable[[PPCudaGraphSettings], Undo | None] | None = None
    stands_aside: Callable[[PPCudaGraphSettings], str | None] = lambda settings: None
    scope: str | None = None


def _wrap_attr(owner: object, attr: str, wrap: Callable[[Callable], Callable]) -> Undo:
    """Replace ``owner.attr`` by ``wrap`` of what it resolves to now; undo restores the
    owner's own attribute, or deletes the wrapper where a class inherited it."""
    own = owner.__dict__.get(attr)
    setattr(owner, attr, wrap(getattr(owner, attr)))
    if own is None:
        return lambda: delattr(owner, attr)
    return lambda: setattr(owner, attr, own)


def _declaring_plugin_variables(original: Callable) -> Callable:
    """vLLM's environment check, run with the plugin's variables set here in vLLM's table."""
    from vllm import envs

    @functools.wraps(original)
    def check(*args, **kwargs):
        names = [n for n in plugin_variables_set() if n not in envs.environment_variables]
        for name in names:
            envs.environment_variables[name] = functools.partial(environment_value, name)
        try:
            return original(*args, **kwargs)
        finally:
            for name in names:
                envs.environment_variables.pop(name, None)

    return check


def _patch_env_names(settings: PPCudaGraphSettings) -> Undo:
    owner, attr = vllm_surface.environ_check()
    if isinstance(vars(owner).get(attr), classmethod):  # the platform's (0.33)
        own = vars(owner)[attr]
        setattr(owner, attr, classmethod(_declaring_plugin_variables(own.__func__)))
        return lambda: setattr(owner, attr, own)
    return _wrap_attr(owner, attr, _declaring_plugin_variables)


def _making_runner(original: Callable) -> Callable:
    from vllm_pp_cudagraph.worker.model_runner import build_runner

    @functools.wraps(original)
    def _make_model_runner(self):
        if not self.use_v2_model_runner or getattr(self.vllm_config, "is_mm_encoder_only", False):
            return original(self)
        return build_runner(self.vllm_config, self.device)

    return _make_model_runner


def _building_runner(original: type) -> Callable:
    """Up to 0.31: what the worker's inline import of MRV2's runner class gets instead."""
    from vllm_pp_cudagraph.worker.model_runner import build_runner

    return functools.wraps(original, updated=())(
        lambda vllm_config, device: build_runner(vllm_config, device))


def _patch_runner_factory(settings: PPCudaGraphSettings) -> Undo:
    if factory := vllm_surface.worker_runner_factory():
        return _wrap_attr(*factory, _making_runner)
    module = importlib.import_module(vllm_surface.V2_RUNNER_MODULE)
    return _wrap_attr(module, "GPUModelRunner", _building_runner)


def _breakable_env_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    if not settings.breakable:
        return "VLLM_PP_CUDAGRAPH_BREAKABLE is off"
    if environment_value("VLLM_USE_BREAKABLE_CUDAGRAPH") == "1":
        return "VLLM_USE_BREAKABLE_CUDAGRAPH=1 is already set"
    return None


def _patch_breakable_env(settings: PPCudaGraphSettings) -> Undo:
    current = environment_value("VLLM_USE_BREAKABLE_CUDAGRAPH")
    if current is not None:
        raise PluginConfigError(
            "VLLM_PP_CUDAGRAPH_BREAKABLE=1 asks for breakable CUDA graphs but "
            f"VLLM_USE_BREAKABLE_CUDAGRAPH={current!r} turns them off; drop one of the two.")
    already = [m for m in vllm_surface.BREAKABLE_DECORATED_MODULES if m in sys.modules]
    if already and vllm_surface.breakable_decided_at_import():
        raise PluginConfigError(
            "VLLM_PP_CUDAGRAPH_BREAKABLE=1 came too late in this process: vLLM already "
            f"imported {already[0]} without breakable graph breaks. Set the variable "
            "in the environment of the process that starts vLLM, or set "
            "VLLM_USE_BREAKABLE_CUDAGRAPH=1 there.")
    return set_variable("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")


def _cadence_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    vllm = settings.decode_cadence is DecodeCadence.VLLM
    return "VLLM_PP_CUDAGRAPH_DECODE_CADENCE=vllm" if vllm else None


def _wrapping_config_post_init(module: str) -> Callable[[PPCudaGraphSettings], Undo]:
    """A patch wrapping ``VllmConfig.__post_init__`` in ``module``'s ``wrap_config_post_init``."""
    def patch(settings: PPCudaGraphSettings) -> Undo:
        config_cls = importlib.import_module(vllm_surface.VLLM_CONFIG_MODULE).VllmConfig
        wrap = importlib.import_module(module).wrap_config_post_init
        return _wrap_attr(config_cls, "__post_init__", wrap)
    return patch


#: vLLM's frames that load the plugins in a worker and in an engine core: (function, class).
_WORKER_ENTRY = ("init_worker", ("vllm.v1.worker.worker_base", "WorkerWrapperBase"))
_ENGINE_CORE_ENTRY = ("__init__", ("vllm.v1.engine.core", "EngineCore"))


def processes_here(frame=None) -> frozenset[Process]:
    """Which of vLLM's processes loads the plugin, from the vLLM frame up the caller's stack:
    a worker's ``init_worker``, the engine core's constructor, else the API server."""
    frame = frame or sys._getframe(1)
    while frame is not None:
        for (function, (module, name)), process in ((_WORKER_ENTRY, Process.WORKER),
                                                    (_ENGINE_CORE_ENTRY, Process.ENGINE_CORE)):
            if frame.f_code.co_name == function and any(
                    c.__module__ == module and c.__name__ == name
                    for c in type(frame.f_locals.get("self")).__mro__):
                return frozenset({process})
        frame = frame.f_back
    return frozenset({Process.API_SERVER})


def enter_process(processes: frozenset[Process], settings: PPCudaGraphSettings) -> None:
    """Apply the patches of ``processes`` in this process (once each), and say so."""
    if applied := apply_for(processes, settings):
        from vllm.logger import init_logger

        init_logger("vllm.pp_cudagraph").info(
            "vllm-pp-cudagraph active in the %s (process %d): patched %s",
            " and ".join(sorted(p.value for p in applied_for())), os.getpid(),
            ", ".join(applied))


def _entering_processes(original: Callable) -> Callable:
    @functools.wraps(original)
    def load_general_plugins(*args, **kwargs):
        result = original(*args, **kwargs)
        enter_process(processes_here(), PPCudaGraphSettings.current())
        return result

    return load_general_plugins


def _patch_process_entry(settings: PPCudaGraphSettings) -> Undo:
    return _wrap_attr(importlib.import_module("vllm.plugins"), "load_general_plugins",
                      _entering_processes)


def _patch_engine_core_check(settings: PPCudaGraphSettings) -> Undo:
    from vllm_pp_cudagraph.engine_core.engine_check import wrap_initialize_kv_caches

    engine_core_cls = importlib.import_module(vllm_surface.ENGINE_CORE_MODULE).EngineCore
    wrap = functools.partial(wrap_initialize_kv_caches, settings=settings)
    return _wrap_attr(engine_core_cls, "_initialize_kv_caches", wrap)


def _kv_update_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    return None if settings.kv_update_in_graphs else "VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS is off"


def _message_queue_cls() -> type:
    return importlib.import_module(vllm_surface.MESSAGE_QUEUE_MODULE).MessageQueue


def _remote_reply_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    can_stop = callable(getattr(_message_queue_cls(), "shutdown", None))
    return None if can_stop else "this vLLM's MessageQueue cannot be shut down"


def _patch_remote_reply(settings: PPCudaGraphSettings) -> Undo:
    from vllm_pp_cudagraph.engine_core.remote_reply import wrap_dequeue

    return _wrap_attr(_message_queue_cls(), "dequeue", wrap_dequeue)


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="process-entry",
        target="vllm.plugins.load_general_plugins (the module attribute vLLM's processes call)",
        why="vLLM does not say which process loads a plugin, and a forked one keeps its parent's "
            "patches; each load now finds out, so each process applies its own and drops the rest.",
        drop_when="vLLM tells a plugin which kind of process loads it.",
        processes=EVERY_PROCESS, apply=_patch_process_entry,
    ),
    Patch(
        name="env-names",
        target="vLLM's check of the VLLM_* variables set (Platform.validate_environ, 0.33; "
               "before that vllm.envs.validate_environ)",
        why="vLLM warns about or refuses VLLM_* variables it does not define, so the plugin's "
            "join its table for that check only: kept there, they would enter its cache key.",
        drop_when="vLLM lets a plugin declare its variables, outside its compile-cache key.",
        processes=frozenset({Process.API_SERVER}), apply=_patch_env_names,
    ),
    Patch(
        name="breakable-env",
        target="environment: VLLM_USE_BREAKABLE_CUDAGRAPH=1 (with VLLM_PP_CUDAGRAPH_BREAKABLE=1)",
        why="vLLM reads breakable mode from this variable (up to 0.32 at import time), so the "
            "plugin's setting is translated into it before the attention layers are imported.",
        drop_when="vLLM reads breakable mode from its config instead of the environment.",
        processes=EVERY_PROCESS, apply=_patch_breakable_env,
        stands_aside=_breakable_env_stands_aside,
    ),
    Patch(
        name="runner-factory",
        target=(f"{vllm_surface.WORKER_MODULE}.Worker.{vllm_surface.RUNNER_FACTORY} (0.32+), else "
                f"{vllm_surface.V2_RUNNER_MODULE}.GPUModelRunner, which the worker imports inline"),
        why="No vLLM setting selects the MRV2 runner class, so the worker's factory builds the "
            "plugin's runner (vLLM's own where the plan stands aside); models on V1 stay there.",
        drop_when="vLLM offers a runner-class setting, or upstream MRV2 handles PP graphs.",
        processes=frozenset({Process.WORKER}), apply=_patch_runner_factory,
    ),
    Patch(
        name="scheduler-class",
        target=(f"{vllm_surface.VLLM_CONFIG_MODULE}.VllmConfig.__post_init__: "
                "scheduler_config.scheduler_cls (with VLLM_PP_CUDAGRAPH_DECODE_CADENCE, "
                "default auto)"),
        why="Under PP a request decodes only every pp_size-th step, so uneven groups leave steps "
            "empty; unless the user names one, a subclass of vLLM's async scheduler regroups them.",
        drop_when="vLLM's scheduler lets a request decode on consecutive steps under PP.",
        processes=frozenset({Process.API_SERVER}), stands_aside=_cadence_stands_aside,
        apply=_wrapping_config_post_init("vllm_pp_cudagraph.api_server.scheduler_choice"),
    ),
    Patch(
        name="engine-core-check",
        target=f"{vllm_surface.ENGINE_CORE_MODULE}.EngineCore._initialize_kv_caches",
        why="A changed decode cadence is safe only if every worker runs the plugin's runner, so "
            "the engine core refuses to start otherwise (and logs PP models on vLLM's V1 runner).",
        drop_when="the decode cadence patch goes (see scheduler-class).",
        processes=frozenset({Process.ENGINE_CORE}), apply=_patch_engine_core_check,
    ),
    Patch(
        name="kv-update-in-graphs",
        target=(f"{vllm_surface.VLLM_CONFIG_MODULE}.VllmConfig.__post_init__ "
                "(with VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS, default on)"),
        why="vLLM splits piecewise graphs at each layer's KV-cache write, a host round trip per "
            "layer; under PP with hoisted layer names and proven backends the write stays in.",
        drop_when="vLLM stops splitting at unified_kv_cache_update for hoisted names (#33267).",
        processes=frozenset({Process.API_SERVER}), stands_aside=_kv_update_stands_aside,
        apply=_wrapping_config_post_init("vllm_pp_cudagraph.api_server.piecewise_split"),
    ),
    Patch(
        name="remote-reply",
        target=f"{vllm_surface.MESSAGE_QUEUE_MODULE}.MessageQueue.dequeue (readers on another node)",
        why="A remote reader's dequeue ignores shutdown, so a dead worker on another node stalls "
            "the engine for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; the wrapper raises at shutdown.",
        drop_when="vLLM's remote MessageQueue readers honour shutdown.",
        processes=frozenset({Process.ENGINE_CORE}), apply=_patch_remote_reply,
        stands_aside=_remote_reply_stands_aside,
    ),
    Patch(
        name="direct-handoff",
        target=("isend_tensor_dict / irecv_tensor_dict of the runner's own pipeline "
                f"{vllm_surface.PARALLEL_STATE_MODULE}.GroupCoordinator (with "
                "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF=1)"),
        why="vLLM sends the intermediate tensors' shapes over gloo before each hand-off, a host "
            "round trip per step; both stages know them already, so only the tensors are sent.",
        drop_when="vLLM hands intermediate tensors on without per-step metadata.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.worker.pipeline.stage_handoff.enable",
    ),
    Patch(
        name="layer-partition",
        target=(f"environment: {vllm_surface.LAYER_PARTITION_ENV} in each worker, before its "
                "model is built (with VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto)"),
        why="vLLM splits layers evenly though the last stage also runs the LM head and sampler, "
            "and takes another split only from this variable: the runner sets it by cost.",
        drop_when="vLLM balances its split by cost, or takes a split from its config.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.shared.layer_partition.apply",
    ),
    Patch(
        name="graph-manager",
        target=f"{vllm_surface.V2_RUNNER_MODULE}.ModelCudaGraphManager, while the plugin's runner "
               "runs initialize_kv_cache",
        why="MRV2 builds its CUDA-graph manager inside initialize_kv_cache and hands it on there; "
            "with the name pointing at PPCudaGraphManager, every holder gets the plugin's.",
        drop_when="MRV2 lets a runner subclass choose its CUDA-graph manager class.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.shared.vllm_surface.managers_built_as",
    ),
    Patch(
        name="capture-guard",
        target=("torch.distributed point-to-point / broadcast / object / barrier functions, "
                "and the pipeline GroupCoordinator's transfer methods"),
        why="A pipeline transfer captured into a CUDA graph would replay without its peer and "
            "hang (vLLM issue #51887), so during capture it raises CapturedCommunicationError.",
        drop_when="vLLM refuses pipeline communication during graph capture itself.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.worker.graphs.capture_guard.forbid_pipeline_communication",
    ),
)

#: The patches applied in this process, with how to undo each; those considered; the
#: processes they were applied for; and the pid applying them (a forked child inherits them).
_undone: dict[str, Undo] = {}
_considered: set[str] = set()
_processes: frozenset[Process] = frozenset()
_pid: int | None = None


def is_applied() -> bool:
    return bool(_processes) and _pid == os.getpid()


def applied_for() -> frozenset[Process]:
    """The processes this one has applied the patches of."""
    return _processes if _pid == os.getpid() else frozenset()


def apply_for(processes: frozenset[Process], settings: PPCudaGraphSettings) -> list[str]:
    """Apply each patch of ``processes`` not applied here yet; return the names applied now.

    A forked process first undoes its parent's patches for none of ``processes``; a failing
    patch undoes every patch applied here, so vLLM is never left half-patched."""
    global _processes, _pid
    if _pid != os.getpid():
        for name in reversed(list(_undone)):
            if not _patch(name).processes & processes:
                _undone.pop(name)()
        _considered.intersection_update(_undone)
        _processes, _pid = frozenset(), os.getpid()
    _processes |= processes
    applied: list[str] = []
    try:
        for patch in PATCHES:
            if patch.name in _considered or not patch.processes & _processes:
                continue
            _considered.add(patch.name)
            undo = apply_patch(patch, settings)
            if undo is not None:
                _undone[patch.name] = undo
                applied.append(patch.name)
    except BaseException:
        undo_all()
        raise
    return applied


def apply_all(settings: PPCudaGraphSettings) -> list[str]:
    """Every process's patches at once (one process that is all of them, as in tests)."""
    return apply_for(EVERY_PROCESS, settings)


def _patch(name: str) -> Patch:
    return next(p for p in PATCHES if p.name == name)


def apply_patch(patch: Patch | str, settings: PPCudaGraphSettings) -> Undo | None:
    """Apply one patch (or the one named) unless it stands aside or is scoped; return its undo."""
    if isinstance(patch, str):
        patch = _patch(patch)
    if patch.apply is None or patch.stands_aside(settings) is not None:
        return None
    return patch.apply(settings)


def standing(settings: PPCudaGraphSettings) -> list[tuple[Patch, str | None]]:
    """Each patch applied at start-up, with why it stands aside here (None: it applies)."""
    return [(patch, patch.stands_aside(settings)) for patch in PATCHES if patch.scope is None]


def undo_all() -> None:
    """Restore vLLM as it was before the patches (used by tests)."""
    global _processes, _pid
    while _undone:
        _undone.popitem()[1]()
    _considered.clear()
    _processes, _pid = frozenset(), None
