"""The engine core checks, once its workers exist, that they can serve the plugin's schedule.

The plugin's decode cadence (decode_cadence.py) runs in the engine core; what
makes it correct runs in the workers: the plugin's runner applies the last
stage's newer tokens on the first stages before a lifted step
(first_stage_tokens.py). A worker that builds vLLM's own runner (a Ray node without this package, a worker process started
without ``VLLM_PLUGINS``) would embed stale tokens without any error. So right
after the engine core has set up its workers' KV caches, and before it
schedules anything, it asks every worker for its runner class and refuses to
start, naming the workers, if one is not the plugin's. The same holds where
``VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto`` splits the layers otherwise than
vLLM: only the plugin's runner hands vLLM that split (layer_partition.py).

Then it logs one line for the engine, at vLLM's default level: the plugin is
active on all workers (layout, decode cadence, CUDA-graph mode), or it stands
aside and why (vLLM's V1 runner, an unproven feature: support.py).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
from vllm.logger import init_logger

from vllm_pp_cudagraph import layer_partition, support
from vllm_pp_cudagraph.decode_cadence import lifts_decodes
from vllm_pp_cudagraph.engine_plan import EnginePlan, plan_engine
from vllm_pp_cudagraph.settings import LayerPartition, PPCudaGraphSettings

logger = init_logger("vllm.pp_cudagraph.engine_check")

#: Module and class name of the runner a worker must have built.
PLUGIN_RUNNER = "vllm_pp_cudagraph.model_runner.PPCudaGraphModelRunner"


class WorkerRunnerError(RuntimeError):
    """A worker runs another model runner than the engine core's schedule needs."""


def runner_class_of(worker: Any) -> str:
    """Run on each worker: the module-qualified class of its model runner.

    Sent to the workers by value, so it runs where this package is missing too.
    """
    runner = getattr(worker, "model_runner", None)
    cls = type(runner)
    return f"{cls.__module__}.{cls.__qualname__}"


def worker_runner_problems(runner_classes: list[str]) -> list[str]:
    return [f"worker {rank}: {name}" for rank, name in enumerate(runner_classes)
            if name != PLUGIN_RUNNER]


def _ask_workers(collective_rpc: Callable[..., list]) -> list[str]:
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        return collective_rpc(runner_class_of)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def mixed_partition_problem(vllm_config: Any, problems: list[str], num_workers: int,
                            partition: LayerPartition) -> str | None:
    """Why some workers would build other layers than the others, or None.

    With ``auto`` the plugin's runner hands vLLM its own split; a worker
    without it builds vLLM's, so some layers would run twice and others never.
    """
    if not problems or len(problems) == num_workers or partition is LayerPartition.VLLM:
        return None
    decision = layer_partition.decide_for(vllm_config, partition)
    if decision.undecided:  # the engine core does not read the GPUs' memory
        return (f"the plugin's workers may build another layer split than vLLM's "
                f"({layer_partition.SETTING}=auto decides there, from each GPU's memory) "
                "and the others vLLM's")
    if (split := decision.env_value) is None:
        return None
    return (f"the plugin's workers build the layer split {split} "
            f"({layer_partition.SETTING}=auto) and the others vLLM's")


def check_workers(vllm_config: Any, collective_rpc: Callable[..., list],
                  plan: EnginePlan) -> None:
    """Refuse an engine whose decode cadence or layer partition (its ``plan``) its workers
    cannot follow; otherwise log the one line that says what the plugin does for it."""
    parallel = vllm_config.parallel_config
    if not vllm_config.use_v2_model_runner:
        architectures = getattr(vllm_config.model_config, "architectures", None) or ["this model"]
        logger.warning(
            "vllm-pp-cudagraph stands aside: vLLM runs %s on its V1 runner, which the "
            "plugin does not change. Set VLLM_USE_V2_MODEL_RUNNER=1 to run Model Runner "
            "V2 with the plugin's CUDA graphs (see the README's supported models).",
            architectures[0],
        )
        return
    classes = _ask_workers(collective_rpc)
    problems = worker_runner_problems(classes)
    if problems and lifts_decodes(plan.cadence):
        raise WorkerRunnerError(
            "The engine core schedules decodes sooner than vLLM's PP cadence "
            "(vllm-pp-cudagraph) but some "
            f"workers do not run the plugin's runner ({'; '.join(problems)}); they would "
            "serve stale tokens. Install vllm-pp-cudagraph and set "
            "VLLM_PLUGINS=pp_cudagraph on every node and worker, or set "
            "VLLM_PP_CUDAGRAPH_DECODE_CADENCE=vllm to keep vLLM's schedule."
        )
    if mixed := mixed_partition_problem(vllm_config, problems, len(classes),
                                        plan.layer_partition):
        raise WorkerRunnerError(
            f"Some workers do not run vllm-pp-cudagraph's runner ({'; '.join(problems)}): "
            f"{mixed}, so some layers would run twice and others never. Install "
            "vllm-pp-cudagraph and set VLLM_PLUGINS=pp_cudagraph on every node and worker, "
            f"or set {layer_partition.SETTING}=vllm."
        )
    layout = (f"PP={parallel.pipeline_parallel_size} x TP={parallel.tensor_parallel_size}")
    if len(problems) == len(classes):
        reason = plan.stand_aside or "no worker runs its runner"
        say = logger.info if plan.no_pipeline else logger.warning
        say("%s (%s): %s; it runs as stock vLLM.", support.STAND_ASIDE, layout, reason)
        return
    if problems:
        logger.warning("vllm-pp-cudagraph runs on %d of %d workers (%s); without it: %s",
                       len(classes) - len(problems), len(classes), layout, "; ".join(problems))
        return
    logger.info("vllm-pp-cudagraph active on all %d workers (%s): decode cadence %s "
                "(VLLM_PP_CUDAGRAPH_DECODE_CADENCE=%s), CUDA graphs %s%s", len(classes),
                layout, plan.cadence, plan.asked_cadence,
                vllm_config.compilation_config.cudagraph_mode,
                ", breakable" if is_breakable_cudagraph_enabled() else "")


def checking_workers(original: Callable[..., Any],
                     settings: PPCudaGraphSettings) -> Callable[..., Any]:
    """Wrap ``EngineCore._initialize_kv_caches``: check the workers once it returns,
    against the engine's plan under ``settings``.

    On a refusal the executor is shut down before the error propagates, so no
    worker is left running.
    """

    @functools.wraps(original)
    def _initialize_kv_caches(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        try:
            check_workers(self.vllm_config, self.model_executor.collective_rpc,
                          plan_engine(settings, self.vllm_config))
        except WorkerRunnerError:
            self.model_executor.shutdown()
            raise
        return result

    return _initialize_kv_caches
