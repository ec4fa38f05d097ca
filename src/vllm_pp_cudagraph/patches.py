"""Every change this plugin makes to vLLM, in one place.

Each :class:`Patch` names its target, why it is needed, and the vLLM change
that would let it go. ``apply_all`` is re-entrant (vLLM calls plugins once per
process, but tests and embedding applications may call ``register`` again) and
``undo_all`` restores vLLM exactly as it was.

Everything else the plugin does happens in its own subclasses
(:class:`~vllm_pp_cudagraph.worker.model_runner.PPCudaGraphModelRunner`,
:class:`~vllm_pp_cudagraph.worker.graphs.cudagraph_manager.PPCudaGraphManager`), which vLLM
only reaches through the patches listed here.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
import os
from dataclasses import dataclass
from enum import Enum

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.settings import (
    DecodeCadence,
    PluginConfigError,
    PPCudaGraphSettings,
    environment_value,
    plugin_variables_set,
    set_variable,
)

Undo = Callable[[], None]


class Process(str, Enum):
    """The kinds of process vLLM runs an engine in, each with its own patches."""

    API_SERVER = "API server"  # or the process of an offline LLM
    ENGINE_CORE = "engine core"
    WORKER = "worker"


EVERY_PROCESS = frozenset(Process)


def _always_applies(settings: PPCudaGraphSettings) -> None:
    return None


@dataclass(frozen=True)
class Patch:
    """One documented modification of vLLM, with a way to undo it.

    ``apply`` applies the patch where it does not stand aside and returns how to undo it,
    or None when nothing changed (None for a patch that exists only inside ``scope``).
    ``stands_aside`` says why the patch is not applied with these settings on this vLLM,
    or None. ``processes``: the processes it is applied in (and only there). ``scope``, for
    a patch the plugin applies later, to one object or inside a context manager: the dotted
    name of what applies and reverts it (``apply_for`` leaves it alone)."""

    name: str
    target: str
    why: str
    drop_when: str
    processes: frozenset[Process]
    apply: Callable[[PPCudaGraphSettings], Undo | None] | None = None
    stands_aside: Callable[[PPCudaGraphSettings], str | None] = _always_applies
    scope: str | None = None


def _wrap_attr(owner: object, attr: str, wrap: Callable[[Callable], Callable]) -> Undo:
    """Replace ``owner.attr`` (of a class or module) by ``wrap`` of what it resolves to now.

    Undo restores the owner's own attribute, or removes the wrapper when a class's
    attribute was inherited, so the owner is exactly as it was.
    """
    own = owner.__dict__.get(attr)
    setattr(owner, attr, wrap(getattr(owner, attr)))

    def undo() -> None:
        if own is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, own)

    return undo


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
            f"VLLM_USE_BREAKABLE_CUDAGRAPH={current!r} turns them off; drop one of the two."
        )
    already = [m for m in vllm_surface.BREAKABLE_DECORATED_MODULES if m in sys.modules]
    if already and vllm_surface.breakable_decided_at_import():
        raise PluginConfigError(
            "VLLM_PP_CUDAGRAPH_BREAKABLE=1 came too late in this process: vLLM already "
            f"imported {already[0]} without breakable graph breaks. Set the variable "
            "in the environment of the process that starts vLLM, or set "
            "VLLM_USE_BREAKABLE_CUDAGRAPH=1 there."
        )
    return set_variable("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")


def _cadence_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    if settings.decode_cadence is DecodeCadence.VLLM:
        return "VLLM_PP_CUDAGRAPH_DECODE_CADENCE=vllm"
    return None


def _patch_scheduler_class(settings: PPCudaGraphSettings) -> Undo:
    from vllm_pp_cudagraph.api_server.scheduler_choice import wrap_config_post_init

    config_cls = importlib.import_module(vllm_surface.VLLM_CONFIG_MODULE).VllmConfig
    return _wrap_attr(config_cls, "__post_init__", wrap_config_post_init)


def _entering_processes(original: Callable) -> Callable:
    @functools.wraps(original)
    def load_general_plugins(*args, **kwargs):
        result = original(*args, **kwargs)
        from vllm_pp_cudagraph import plugin

        plugin.enter_process(plugin.processes_here())
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
    if settings.kv_update_in_graphs:
        return None
    return "VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS is off"


def _patch_kv_update_in_graphs(settings: PPCudaGraphSettings) -> Undo:
    from vllm_pp_cudagraph.api_server.piecewise_split import wrap_config_post_init

    config_cls = importlib.import_module(vllm_surface.VLLM_CONFIG_MODULE).VllmConfig
    return _wrap_attr(config_cls, "__post_init__", wrap_config_post_init)


def _message_queue_cls() -> type:
    return importlib.import_module(vllm_surface.MESSAGE_QUEUE_MODULE).MessageQueue


def _remote_reply_stands_aside(settings: PPCudaGraphSettings) -> str | None:
    if callable(getattr(_message_queue_cls(), "shutdown", None)):
        return None
    return "this vLLM's MessageQueue cannot be shut down"


def _patch_remote_reply(settings: PPCudaGraphSettings) -> Undo:
    from vllm_pp_cudagraph.engine_core.remote_reply import wrap_dequeue

    return _wrap_attr(_message_queue_cls(), "dequeue", wrap_dequeue)


PATCHES: tuple[Patch, ...] = (
    Patch(
        name="process-entry",
        target="vllm.plugins.load_general_plugins (the module attribute vLLM's processes call)",
        why=(
            "vLLM runs its general plugins once per process, from the API server's "
            "arguments, the engine core's constructor and each worker's init_worker; a "
            "process forked from another inherits its patches and never calls a plugin "
            "again. Each later call now tells the plugin which process is starting here "
            "(from vLLM's frame that calls it), so every process applies its own patches "
            "and a forked one drops those of its parent."
        ),
        drop_when="vLLM tells a plugin which kind of process loads it.",
        processes=EVERY_PROCESS,
        apply=_patch_process_entry,
    ),
    Patch(
        name="env-names",
        target="vLLM's check of the VLLM_* variables set (Platform.validate_environ, 0.33; "
               "before that vllm.envs.validate_environ)",
        why=(
            "vLLM treats every VLLM_* variable it does not define as unknown: it warns "
            "about each (\"Unknown vLLM environment variable detected\"), and with "
            "fail_on_environ_validation refuses to start. For that check alone the "
            "plugin's settings set in this process are in vLLM's table. Kept there, they "
            "would enter vLLM's compile-cache key (compile_factors hashes every variable "
            "of the table), so a metrics directory made afresh on each start would make "
            "every restart recompile; what the settings change in the compiled graph "
            "reaches vLLM through its own config and variables, which it hashes itself."
        ),
        drop_when="vLLM lets a plugin declare its environment variables, outside its "
                  "compile-cache key.",
        processes=frozenset({Process.API_SERVER}),
        apply=_patch_env_names,
    ),
    Patch(
        name="breakable-env",
        target="environment: VLLM_USE_BREAKABLE_CUDAGRAPH=1 (with VLLM_PP_CUDAGRAPH_BREAKABLE=1)",
        why=(
            "vLLM decides from this variable at config time that breakable mode turns "
            "torch.compile off, and up to 0.32 at import time whether attention ops "
            "break breakable captures. The plugin setting is translated into it "
            "before anything imports the attention layers (the next patch does), "
            "so both switches behave the same in every process."
        ),
        drop_when="vLLM reads breakable mode from its config instead of the environment.",
        processes=EVERY_PROCESS,
        apply=_patch_breakable_env,
        stands_aside=_breakable_env_stands_aside,
    ),
    Patch(
        name="runner-factory",
        target=(f"{vllm_surface.WORKER_MODULE}.Worker.{vllm_surface.RUNNER_FACTORY} (0.32+), else "
                f"{vllm_surface.V2_RUNNER_MODULE}.GPUModelRunner, which the worker imports inline"),
        why=(
            "vLLM has no setting that selects the MRV2 runner class. The worker's factory "
            "(\"subclasses override this\") builds the plugin's runner, or vLLM's own where "
            "the engine's plan stands aside; before 0.32 the worker builds MRV2 from this "
            "module attribute, which then points at the same factory. Models vLLM runs on "
            "its V1 runner are left there."
        ),
        drop_when=(
            "vLLM offers a runner-class setting, or upstream MRV2 has the PP graph handling "
            "this plugin adds (not the case up to 0.33)."
        ),
        processes=frozenset({Process.WORKER}),
        apply=_patch_runner_factory,
    ),
    Patch(
        name="scheduler-class",
        target=(f"{vllm_surface.VLLM_CONFIG_MODULE}.VllmConfig.__post_init__: "
                "scheduler_config.scheduler_cls (with VLLM_PP_CUDAGRAPH_DECODE_CADENCE, "
                "default auto)"),
        why=(
            "With MRV2 and PP a request may decode only every pp_size-th step, so "
            "requests take turns in groups of whatever size they arrived in and a lone "
            "group leaves steps empty. The plugin's scheduler, a subclass of vLLM's async "
            "one, moves requests before each step as the setting says (docs/settings.md; "
            "structured outputs never are; the plugin's runner applies the last stage's "
            "newer tokens on the first stages before a lifted step). vLLM takes a "
            "scheduler class from its config; where the user gave none, the config names "
            "the plugin's once vLLM has settled async scheduling. A scheduler class of the "
            "user's own is kept, with vLLM's cadence. Details: decode_cadence.py."
        ),
        drop_when="vLLM's scheduler lets a request decode on consecutive steps under PP.",
        processes=frozenset({Process.API_SERVER}),
        apply=_patch_scheduler_class,
        stands_aside=_cadence_stands_aside,
    ),
    Patch(
        name="engine-core-check",
        target=f"{vllm_surface.ENGINE_CORE_MODULE}.EngineCore._initialize_kv_caches",
        why=(
            "A changed decode cadence is safe only if every worker runs the plugin's runner, "
            "which applies the newer tokens on the first stages; a worker without the "
            "package (a Ray node installed apart) would serve stale tokens. Once the "
            "engine core has its workers it asks each for its runner class and, if one "
            "is not the plugin's, shuts them down and refuses to start. It also logs "
            "when vLLM runs a pipeline-parallel model on its V1 runner, where the "
            "plugin stands aside. Details: engine_check.py."
        ),
        drop_when="the decode cadence patch goes (see scheduler-class).",
        processes=frozenset({Process.ENGINE_CORE}),
        apply=_patch_engine_core_check,
    ),
    Patch(
        name="kv-update-in-graphs",
        target=(
            f"{vllm_surface.VLLM_CONFIG_MODULE}.VllmConfig.__post_init__ "
            "(with VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS, default on)"
        ),
        why=(
            "vLLM splits piecewise graphs at each layer's KV-cache write as well as at "
            "its attention, so the write runs eagerly: a host round trip per layer. "
            "With torch's hoisted layer names (2.11+) one piece serves every layer with "
            "the write inside, so under PP the (non-MLA) write leaves vLLM's split "
            "points, with the backends proven with it. Details: piecewise_split.py."
        ),
        drop_when=(
            "vLLM stops splitting at unified_kv_cache_update when layer names are "
            "hoisted (the comment at its default split points, vLLM issue #33267)."
        ),
        processes=frozenset({Process.API_SERVER}),
        apply=_patch_kv_update_in_graphs,
        stands_aside=_kv_update_stands_aside,
    ),
    Patch(
        name="remote-reply",
        target=f"{vllm_surface.MESSAGE_QUEUE_MODULE}.MessageQueue.dequeue (readers on another node)",
        why=(
            "A worker on another node replies through a zmq socket that dequeue polls "
            "with no look at the queue's shutdown. When such a worker dies (PP over two "
            "Ray nodes), the executor shuts its queues down, but the engine core's step "
            "keeps waiting for the dead worker's reply, so the server holds its requests "
            "and serves nothing for VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s). The "
            "wrapper polls in slices and raises once the queue is shut down, as a "
            "shared-memory reader does; every reply is still read by vLLM's dequeue. "
            "Details: remote_reply.py."
        ),
        drop_when="vLLM's remote MessageQueue readers honour shutdown.",
        processes=frozenset({Process.ENGINE_CORE}),
        apply=_patch_remote_reply,
        stands_aside=_remote_reply_stands_aside,
    ),
    Patch(
        name="direct-handoff",
        target=(
            "isend_tensor_dict / irecv_tensor_dict of the runner's own pipeline "
            f"{vllm_surface.PARALLEL_STATE_MODULE}.GroupCoordinator (with "
            "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF=1)"
        ),
        why=(
            "Before each hand-off of intermediate tensors vLLM sends their keys and "
            "shapes over gloo, and the receiving stage's host waits for them before "
            "posting its receives: a host round trip between the stages every step. "
            "Both stages know those shapes already (checked at start-up; the token "
            "count is the padded size both derive from the scheduler output). On "
            "the pipeline groups the plugin's runner enables, only the tensors are "
            "sent, and received straight into the runner's input buffers; every other "
            "group and call is vLLM's. Details: stage_handoff.py."
        ),
        drop_when="vLLM hands intermediate tensors on without per-step metadata.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.worker.pipeline.stage_handoff.enable",
    ),
    Patch(
        name="layer-partition",
        target=(
            f"environment: {vllm_surface.LAYER_PARTITION_ENV} in each worker, before its model "
            "is built (with VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto)"
        ),
        why=(
            "vLLM splits the layers evenly over the stages, though the last one also "
            "runs the LM head and the sampler, and takes another split only from this "
            "variable (get_pp_indices, when each worker builds its model). The plugin's "
            "runner sets it to the split it chose from the stages' predicted costs, "
            "the same on every rank, unless it was set by hand; where vLLM already "
            "cached its variables, it clears that cache. Details: layer_partition.py."
        ),
        drop_when="vLLM balances its split by cost, or takes a split from its config.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.shared.layer_partition.apply",
    ),
    Patch(
        name="graph-manager",
        target=f"{vllm_surface.V2_RUNNER_MODULE}.ModelCudaGraphManager, while the plugin's runner "
               "runs initialize_kv_cache",
        why=(
            "MRV2 builds its model CUDA-graph manager inside initialize_kv_cache and hands "
            "it on there (FastPrefillHelper, 0.33); with the name pointing at "
            "PPCudaGraphManager for that call, vLLM builds the plugin's manager with its "
            "own arguments and every holder gets it. The runner refuses to go on if any "
            "holder kept vLLM's."
        ),
        drop_when="MRV2 lets a runner subclass choose its CUDA-graph manager class.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.shared.vllm_surface.managers_built_as",
    ),
    Patch(
        name="capture-guard",
        target=(
            "torch.distributed point-to-point / broadcast / object / barrier functions, "
            "and the pipeline GroupCoordinator's transfer methods"
        ),
        why=(
            "While CUDA graphs are captured (and graph memory is measured), a pipeline "
            "send/receive recorded into a graph would replay without its peer and hang "
            "(vLLM issue #51887). The wrappers raise CapturedCommunicationError instead; "
            "everything is restored when capture ends."
        ),
        drop_when="vLLM refuses pipeline communication during graph capture itself.",
        processes=frozenset({Process.WORKER}),
        scope="vllm_pp_cudagraph.worker.graphs.capture_guard.forbid_pipeline_communication",
    ),
)


#: The patches applied in this process, by name, with how to undo each; what they were
#: applied for; and the process they were applied in (a forked child inherits them).
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

    In a process forked from another, the parent's patches that are for none of
    ``processes`` are undone first. If a patch fails, every patch applied here is undone
    before the error propagates, so vLLM is never left half-patched."""
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
    """Apply one patch (or the one of that name) unless it stands aside or is scoped;
    return its undo, or None when nothing changed."""
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
