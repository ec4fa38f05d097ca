"""Once its workers exist, the engine core refuses an engine whose plan needs the plugin's runner
on a worker without it (docs/architecture.md); under PP, one whose workers all run it is watched."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
from vllm.logger import init_logger

from vllm_pp_cudagraph.engine_core.stall_watch import SETTING as STALL_SETTING, StallWatch
from vllm_pp_cudagraph.shared.engine_plan import LIFTING, EngineFacts, EnginePlan, plan_engine
from vllm_pp_cudagraph.shared.snapshots import PlanRecord, metrics_dir, write_snapshot
from vllm_pp_cudagraph.shared import layer_partition, support
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger("vllm.pp_cudagraph.engine_check")


class WorkerRunnerError(RuntimeError):
    """A worker runs another model runner than the engine core's schedule needs."""


def plan_of(worker: Any) -> dict[str, Any] | None:
    """Run on each worker (sent by value, so it runs where this package is missing too):
    its runner's plan as plain values, or None where it runs vLLM's own runner."""
    plan = getattr(getattr(worker, "model_runner", None), "plan", None)
    return None if plan is None else plan.record()


def _refuse(problems: list[str], what: str, instead: str) -> WorkerRunnerError:
    return WorkerRunnerError(
        f"Some workers do not run vllm-pp-cudagraph's runner ({'; '.join(problems)}): "
        f"{what}. Install vllm-pp-cudagraph and set VLLM_PLUGINS=pp_cudagraph on every "
        f"node and worker, or set {instead}.")


def check_plans(plan: EnginePlan, workers: list[dict[str, Any] | None]) -> list[str]:
    """Refuse workers that cannot follow the engine core's ``plan`` or disagree with each
    other; return the workers that run vLLM's own runner (where that is safe)."""
    problems = [f"worker {rank}: vLLM's own runner" for rank, record in enumerate(workers)
                if record is None]
    ours = [record for record in workers if record is not None]
    if problems and plan.cadence in LIFTING:
        raise _refuse(problems, "the engine core schedules decodes sooner than vLLM's PP "
                      "cadence, so they would serve stale tokens",
                      "VLLM_PP_CUDAGRAPH_DECODE_CADENCE=vllm to keep vLLM's schedule")
    if problems and any(record["split_source"] == "auto" for record in ours):
        raise _refuse(problems, f"the plugin's workers build the layer split "
                      f"{ours[0]['layers']} and the others vLLM's, so some layers would run "
                      "twice and others never", f"{layer_partition.SETTING}=vllm")
    splits = {tuple(record["layers"] or ()) for record in ours}
    if len(splits) > 1:
        raise WorkerRunnerError(
            f"The plugin's workers chose different layer splits ({sorted(splits)}): "
            f"{layer_partition.SETTING}=auto decides from each GPU's memory, and these GPUs "
            f"differ. Set {layer_partition.VLLM_ENV} by hand, or {layer_partition.SETTING}=vllm.")
    return problems


def check_workers(vllm_config: VllmConfig, collective_rpc: Callable[..., list],
                  plan: EnginePlan) -> bool:
    """Refuse an engine whose workers cannot follow its ``plan``; otherwise log the one
    line that says what the plugin does for it. True where every worker runs the plugin."""
    parallel = vllm_config.parallel_config
    if not vllm_config.use_v2_model_runner:
        architectures = getattr(vllm_config.model_config, "architectures", None) or ["this model"]
        logger.warning("vllm-pp-cudagraph stands aside: vLLM runs %s on its V1 runner, which the "
                       "plugin does not change. Set VLLM_USE_V2_MODEL_RUNNER=1 to run Model "
                       "Runner V2 with the plugin's CUDA graphs (see the README's supported "
                       "models).", architectures[0])
        return False
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        workers = collective_rpc(plan_of)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    try:
        problems = check_plans(plan, workers)
    finally:
        # Where ``bench`` and ``check`` read the plans (with the per-stage metrics on or off).
        engine = getattr(parallel, "data_parallel_rank", 0)
        write_snapshot(PlanRecord(f"engine-{engine}", {"engine": plan.record(),
                                                       "workers": workers}))
    layout = f"PP={parallel.pipeline_parallel_size} x TP={parallel.tensor_parallel_size}"
    if len(problems) == len(workers):
        reason = plan.stand_aside or "no worker runs its runner"
        say = logger.info if plan.no_pipeline else logger.warning
        say("%s (%s): %s; it runs as stock vLLM.", support.STAND_ASIDE, layout, reason)
        return False
    if problems:
        logger.warning("vllm-pp-cudagraph runs on %d of %d workers (%s); without it: %s",
                       len(workers) - len(problems), len(workers), layout, "; ".join(problems))
        return False
    logger.info("vllm-pp-cudagraph active on all %d workers (%s): decode cadence %s "
                "(VLLM_PP_CUDAGRAPH_DECODE_CADENCE=%s), CUDA graphs %s%s", len(workers), layout,
                plan.cadence, plan.asked_cadence, vllm_config.compilation_config.cudagraph_mode,
                ", breakable" if is_breakable_cudagraph_enabled() else "")
    return True


def start_stall_watch(engine_core: Any, settings: PPCudaGraphSettings) -> StallWatch | None:
    """Watch this engine core's pipeline under PP unless the limit is 0 (its thread keeps it)."""
    parallel = engine_core.vllm_config.parallel_config
    if parallel.pipeline_parallel_size < 2 or settings.stall_limit_s == 0:
        return None
    # vLLM's batch queue (0.33: EngineCore.batch_queue, set after the KV caches).
    watch = StallWatch(lambda: list(getattr(engine_core, "batch_queue", None) or ()),
                       metrics_dir(), getattr(parallel, "data_parallel_rank", 0),
                       parallel.pipeline_parallel_size, parallel.tensor_parallel_size,
                       settings.stall_limit_s)
    logger.info("vllm-pp-cudagraph watches the pipeline for stuck stages (stall limit %.0f s, "
                "%s)", settings.stall_limit_s, STALL_SETTING)
    return watch.start()


def wrap_initialize_kv_caches(original: Callable[..., Any],
                              settings: PPCudaGraphSettings) -> Callable[..., Any]:
    """Wrap ``EngineCore._initialize_kv_caches`` to check the workers against the engine's
    plan once it returns; a refusal shuts the executor down before raising."""
    @functools.wraps(original)
    def _initialize_kv_caches(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            active = check_workers(self.vllm_config, self.model_executor.collective_rpc,
                                   plan_engine(settings, EngineFacts.of(self.vllm_config)))
        except WorkerRunnerError:
            self.model_executor.shutdown()
            raise
        if active:
            start_stall_watch(self, settings)
        return result

    return _initialize_kv_caches
