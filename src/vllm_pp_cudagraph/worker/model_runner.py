"""The plugin's Model Runner V2 subclass."""

from __future__ import annotations

import faulthandler
import os
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_pcp_group, get_pp_group, get_tp_group
from vllm.logger import init_logger
from vllm.sequence import IntermediateTensors
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph.shared import layer_partition, support, vllm_surface
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, EnginePlan, plan_engine
from vllm_pp_cudagraph.shared.heartbeats import STACKS_SIGNAL, Heartbeat, Phase, heartbeat_path
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings
from vllm_pp_cudagraph.shared.snapshots import PlanRecord, metrics_dir, write_snapshot
from vllm_pp_cudagraph.worker.graphs.cudagraph_manager import PPCudaGraphManager
from vllm_pp_cudagraph.worker.pipeline import stage_handoff
from vllm_pp_cudagraph.worker.pipeline.first_stage_tokens import (
    batch_req_indices, consume_entries_needed_by)
from vllm_pp_cudagraph.worker.pipeline.stage_exchange import (
    announce_runner, check_peer_runners, exchange_peers, gather_from_stages)
from vllm_pp_cudagraph.worker.pipeline.stage_failure import (
    end_with_parent, is_output_rank, stopping_worker_on_error)
from vllm_pp_cudagraph.worker.pipeline.stage_inputs import (
    DECLARED, PRODUCED, Schema, check_handoff_schemas, check_padding_agreement,
    check_stage_inputs, schema_of)
from vllm_pp_cudagraph.worker.sampling_compile import SamplingCompile
from vllm_pp_cudagraph.worker.stage_clock import StageClock

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
    from vllm.v1.worker.gpu.input_batch import InputBatch

logger = init_logger("vllm.pp_cudagraph.runner")


class GraphConfigError(ValueError):
    """A CUDA-graph setting combination the plugin cannot run."""


class RunnerStandsAsideError(ValueError):
    """The plugin's runner was built directly for an engine the plugin stands aside for."""


def check_graph_settings(vllm_config: VllmConfig) -> None:
    """Refuse breakable graphs together with a setting that turns graphs off."""
    if not is_breakable_cudagraph_enabled():
        return
    compilation = vllm_config.compilation_config
    if vllm_config.model_config is not None and vllm_config.model_config.enforce_eager:
        culprit = "enforce_eager=True (--enforce-eager)"
    elif compilation.cudagraph_mode == CUDAGraphMode.NONE:
        culprit = "compilation_config.cudagraph_mode=NONE"
    else:
        return
    raise GraphConfigError(
        f"Breakable CUDA graphs were requested (VLLM_PP_CUDAGRAPH_BREAKABLE or "
        f"VLLM_USE_BREAKABLE_CUDAGRAPH), but {culprit} disables CUDA graphs. "
        "Drop one of the two settings.")


def build_runner(vllm_config: VllmConfig, device: torch.device) -> GPUModelRunner:
    """The worker's MRV2 runner (the ``runner-factory`` patch): the plugin's, or vLLM's own
    where the engine's plan stands aside; refuses an engine stock vLLM is known to fail."""
    plan = worker_plan(vllm_config)
    if plan.stand_aside:
        write_plan_record(plan.record())
        say = logger.info if plan.no_pipeline else logger.warning
        say("%s: %s; the worker runs vLLM's own runner%s.", support.STAND_ASIDE,
            plan.stand_aside, "" if plan.no_pipeline else
            " (VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN=1 to run the plugin anyway)")
        return GPUModelRunner(vllm_config, device)
    return PPCudaGraphModelRunner(vllm_config, device, plan)


def worker_plan(vllm_config: VllmConfig) -> EnginePlan:
    """This worker's plan for its engine (with its GPU's memory), unless refused."""
    return check_refusal(plan_engine(PPCudaGraphSettings.current(), EngineFacts.of(vllm_config),
                                     layer_partition.gpu_memory_bytes()))


def check_refusal(plan: EnginePlan) -> EnginePlan:
    """``plan``, unless it refuses the engine (one stock vLLM is known to fail)."""
    if plan.refusal:
        raise support.KnownStockFailureError(
            f"vllm-pp-cudagraph refuses this engine: {plan.refusal}.")
    return plan


def write_plan_record(record: dict) -> None:
    """Leave this rank's plan and pid where ``bench`` and ``check`` read it, metrics on or off."""
    stage, tp_rank = get_pp_group().rank_in_group, get_tp_group().rank_in_group
    write_snapshot(PlanRecord(f"{stage}-{tp_rank}", {**record, "stage": stage,
                                                     "tp_rank": tp_rank, "pid": os.getpid()}))


def check_manager_holders(runner: object) -> None:
    """Refuse a runner where anything still holds vLLM's own model CUDA-graph manager
    (the runner, or what it handed the manager to, such as ``FastPrefillHelper``)."""
    stock = [name for name, value in _holders(runner) if isinstance(value, ModelCudaGraphManager)
             and not isinstance(value, PPCudaGraphManager)]
    if stock or runner.cudagraph_manager is None:  # type: ignore[attr-defined]
        raise RuntimeError(
            f"vLLM built its own CUDA-graph manager for {', '.join(stock) or 'the runner'} "
            "where the plugin builds its own (vllm_surface.managers_built_as): this vLLM is not "
            "supported; remove pp_cudagraph from VLLM_PLUGINS.")


def _holders(runner: object):
    for name, value in vars(runner).items():
        yield name, value
        for inner, held in getattr(value, "__dict__", {}).items():
            yield f"{name}.{inner}", held


class PPCudaGraphModelRunner(GPUModelRunner):
    """Model Runner V2 with the plugin's pipeline-parallel CUDA-graph handling: layer split,
    hand-off checks, graph memory before KV-cache sizing, :class:`PPCudaGraphManager`, newer
    tokens on first stages, and a worker stopped when a serving step fails."""

    cudagraph_manager: PPCudaGraphManager | None

    def __init__(self, vllm_config: VllmConfig, device: torch.device,
                 plan: EnginePlan | None = None):
        check_graph_settings(vllm_config)
        self.plan = check_refusal(plan) if plan else worker_plan(vllm_config)
        if self.plan.stand_aside:
            # Built directly (not by build_runner), for an engine the plugin leaves to vLLM.
            raise RunnerStandsAsideError(
                f"{support.STAND_ASIDE}: {self.plan.stand_aside}. Build the runner with "
                "vllm_pp_cudagraph.build_runner(vllm_config, device), which gives vLLM's own "
                "runner where the plugin stands aside, instead of PPCudaGraphModelRunner.")
        self._init_stage_state()
        super().__init__(vllm_config, device)
        self.pp_stage = get_pp_group().rank_in_group
        self.tp_size = get_tp_group().world_size
        self.replies_to_engine = is_output_rank(
            self.is_last_pp_rank, get_tp_group().rank_in_group, get_pcp_group().rank_in_group)
        logger.info("PPCudaGraphModelRunner on pipeline stage %d of %d (first=%s, last=%s, "
                    "breakable=%s)", self.pp_stage, self.parallel_config.pipeline_parallel_size,
                    self.is_first_pp_rank, self.is_last_pp_rank, is_breakable_cudagraph_enabled())
        if self.use_pp:
            self._watch_engine_core()
            self._start_heartbeat()
            # Before any exchange with its peers: they check for it (check_peer_runners).
            announce_runner(torch.distributed.get_rank())
            self._choose_handoff()

    def _watch_engine_core(self) -> None:
        # Under the multiprocess executor the engine core may exit without ending this worker.
        if self.parallel_config.distributed_executor_backend == "mp":
            end_with_parent()

    def _start_heartbeat(self) -> None:
        """Tell the engine core's stall watch where this rank is, and dump stacks when asked."""
        tp_rank = get_tp_group().rank_in_group
        engine = getattr(self.parallel_config, "data_parallel_rank", 0)
        self.heartbeat = Heartbeat(heartbeat_path(metrics_dir(), engine, self.pp_stage, tp_rank),
                                   self.pp_stage, tp_rank)
        faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)

    def _init_stage_state(self) -> None:
        """Set before vLLM's __init__, which may call the overrides that read it."""
        self._graph_memory_estimate: int | None = None  # vLLM's, reserved before KV-cache sizing
        self._received_tokens: int | None = None  # this step's, checked against its padding
        self._produced_schema: Schema | None = None  # what the first dummy run handed on
        self._step_cached_req_ids: list[str] | None = None  # this step's (first_stage_tokens.py)
        self._pending_input: stage_handoff.PendingStageInput | None = None  # direct hand-off
        self.direct_handoff = False  # tensors handed on without per-step metadata
        self.replies_to_engine = False  # vLLM's executor reads this rank (a failed step raises)
        self.stage_clock: StageClock | None = None  # step timings (TP rank 0 of each stage)
        self.heartbeat: Heartbeat | None = None  # where this rank is, for the stall watch
        self.sampling_compile: SamplingCompile | None = None  # until the first sampling

    def _choose_handoff(self) -> None:
        """Hand tensors on without per-step metadata where the plan and pipeline group allow."""
        if not (self.plan.direct_handoff or self.plan.direct_handoff_blocker):
            return
        group = get_pp_group()
        if blocker := self.plan.direct_handoff_blocker or stage_handoff.group_blocker(group):
            logger.info("Direct hand-off stands aside on pipeline stage %d: %s",
                        self.pp_stage, blocker)
            return
        stage_handoff.enable(group)
        self.direct_handoff = True
        logger.info("Pipeline stage %d passes intermediate tensors without per-step "
                    "metadata (direct hand-off)", self.pp_stage)

    def load_model(self, *args, **kwargs) -> None:
        if self.use_pp:
            self._apply_layer_split()
        super().load_model(*args, **kwargs)
        if self.use_pp:
            self._check_stage_handoffs()
            self._start_stage_clock()
            self._register_sampling_warm_ups()
        write_plan_record({**self.plan.record(), "direct_handoff": self.direct_handoff})

    def _register_sampling_warm_ups(self) -> None:
        """Have vLLM's warm-up compile the last stage's top-k/top-p Triton kernels, which MRV2
        warms only with drafts; else a new batch size compiles mid-load and every stream waits.
        They compile beside the profiling run, unless drafts (which sample) run in it."""
        if not self.is_last_pp_rank or getattr(self, "sampler", None) is None:
            return
        registry = getattr(self, "jit_warmup_registry", None)
        if vllm_surface.register_sampling_warm_ups(registry) and self.speculative_config is None:
            self.sampling_compile = SamplingCompile(self.vllm_config, self.device).start()

    def _dummy_sampler_run(self, hidden_states: torch.Tensor) -> None:
        # The profiling run's first sampling: the kernels' compile must be done before it.
        if self.sampling_compile is not None:
            self.sampling_compile.wait()
            self.sampling_compile = None
        super()._dummy_sampler_run(hidden_states)

    def _start_stage_clock(self) -> None:
        if not PPCudaGraphSettings.current().metrics or get_tp_group().rank_in_group != 0:
            return
        start, end = self.model_config.get_layers_start_end_indices(self.parallel_config)
        stage_ms = self.plan.predicted_stage_ms
        self.stage_clock = StageClock(
            stage=self.pp_stage, pp_size=self.parallel_config.pipeline_parallel_size,
            tp_size=self.tp_size, layers=end - start,
            predicted_step_ms=stage_ms[self.pp_stage] if stage_ms else None,
            engine=getattr(self.parallel_config, "data_parallel_rank", 0))

    def _apply_layer_split(self) -> None:
        """Apply the plan's layer split before the model is built; stage 0 logs a notable one."""
        decision = self.plan.partition
        layer_partition.apply(decision)
        if decision.noteworthy and self.pp_stage == 0 and get_tp_group().rank_in_group == 0:
            logger.info("%s", decision.log_line())

    def _check_stage_handoffs(self, produced: Schema | None = None) -> None:
        """All stages compare what they send with what the next expects, after loading (as
        declared) and after the profiling run (as produced): a mismatch stops start-up."""
        if produced is None:
            # The first exchange: a peer on vLLM's own runner would never join it.
            check_peer_runners(exchange_peers())
        sends = produced
        if sends is None and not self.is_last_pp_rank:
            sends = schema_of(self.model.make_empty_intermediate_tensors(
                batch_size=1, dtype=self.model_config.dtype, device=self.device).tensors)
        expects = (None if self.intermediate_tensors is None
                   else schema_of(self.intermediate_tensors.tensors))
        # Every stage evaluates the same gathered lists, so all raise or none does.
        everyone = gather_from_stages((sends, expects, produced is not None, self.direct_handoff))
        stage_handoff.check_stages_agree([direct for *_, direct in everyone])
        sent_as = PRODUCED if all(p for _, _, p, _ in everyone[:-1]) else DECLARED
        check_handoff_schemas([s for s, *_ in everyone], [e for _, e, *_ in everyone], sent_as,
                              vllm_surface.stage_reserved_key_prefixes())

    def profile_run(self, *args, **kwargs) -> None:
        super().profile_run(*args, **kwargs)
        if self.use_pp:
            self._check_stage_handoffs(produced=self._produced_schema)
            self._warm_up_received_token_update()

    def _warm_up_received_token_update(self) -> None:
        """Compile before serving the token-update variant a first stage applies with the last
        stage's tokens (no vLLM warm-up runs it; not with drafts). The kernel skips rows of
        request index -1; counts are two rows of one int32 tensor as ``PPHandler.receive`` lays
        them out, and Triton specialises on the second row's 16-byte alignment, so both run."""
        if self.is_last_pp_rank or self.speculative_config is not None:
            return
        for num_reqs in (4, 1):
            counts = torch.zeros(2, num_reqs, dtype=torch.int32, device=self.device)
            num_sampled, num_rejected = counts.unbind(dim=0)
            self.postprocess_sampled(
                idx_mapping=torch.full((num_reqs,), -1, dtype=torch.int32, device=self.device),
                sampled_tokens=torch.zeros(num_reqs, 1, dtype=torch.int64, device=self.device),
                num_sampled=num_sampled, num_rejected=num_rejected)

    def profile_cudagraph_memory(self, *args, **kwargs) -> int:
        # Kept for the manager's record of what capture took.
        self._graph_memory_estimate = super().profile_cudagraph_memory(*args, **kwargs)
        return self._graph_memory_estimate

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig, *args, **kwargs) -> None:
        with vllm_surface.managers_built_as(PPCudaGraphManager):
            super().initialize_kv_cache(kv_cache_config, *args, **kwargs)
        check_manager_holders(self)
        self.cudagraph_manager.estimated_bytes = self._graph_memory_estimate

    def capture_model(self, *args, **kwargs) -> int:
        # *args: ``profile_only`` exists on some releases only.
        assert self.cudagraph_manager is not None
        if not self.cudagraph_manager.needs_capture():
            # vLLM returns early here, but other stages may capture and wait for this outcome.
            self.cudagraph_manager.settle_with_other_stages()
        return super().capture_model(*args, **kwargs)

    def execute_model(self, scheduler_output: SchedulerOutput,
                      intermediate_tensors: IntermediateTensors | None = None,
                      dummy_run: bool = False, *args, **kwargs):
        clock = None if dummy_run else self.stage_clock
        if clock is not None:
            clock.step_started()
        heartbeat = None if dummy_run else self.heartbeat
        if heartbeat is not None:
            heartbeat.begin()
        with self._serving_step("execute_model", serving=not dummy_run):
            output = self._execute_step(scheduler_output, intermediate_tensors, dummy_run,
                                        *args, **kwargs)
        # The last stage's step ends with its sampling, which an empty step has none of.
        if heartbeat is not None and (not self.is_last_pp_rank
                                      or scheduler_output.total_num_scheduled_tokens == 0):
            heartbeat.step_done()
        if clock is not None and isinstance(output, IntermediateTensors):
            clock.step_ended(self._replayed(), sum(t.nbytes for t in output.tensors.values()))
        return output

    def _replayed(self) -> bool:
        return bool(getattr(self.cudagraph_manager, "last_replayed", False))

    def _execute_step(self, scheduler_output, intermediate_tensors, dummy_run, *args, **kwargs):
        self._pending_input = (None if dummy_run
                               else stage_handoff.pending_input(intermediate_tensors))
        if self._pending_input is None and intermediate_tensors is not None and not dummy_run:
            assert self.intermediate_tensors is not None
            self._received_tokens = check_stage_inputs(
                self.intermediate_tensors.tensors, intermediate_tensors,
                scheduler_output.total_num_scheduled_tokens, self.pp_stage, tp_size=self.tp_size)
        if not dummy_run:
            self._step_cached_req_ids = scheduler_output.scheduled_cached_reqs.req_ids
        try:
            output = super().execute_model(scheduler_output, intermediate_tensors, dummy_run,
                                           *args, **kwargs)
        finally:
            self._received_tokens = self._step_cached_req_ids = self._pending_input = None
        if dummy_run and self._produced_schema is None and isinstance(output, IntermediateTensors):
            self._produced_schema = schema_of(output.tensors)
        return output

    def sample_tokens(self, grammar_output: GrammarOutput | None
                      ) -> AsyncModelRunnerOutput | ModelRunnerOutput | None:
        if self.heartbeat is not None and self.heartbeat.in_step:
            self.heartbeat.enter(Phase.SAMPLING)
        with self._serving_step("sample_tokens"):
            output = super().sample_tokens(grammar_output)
        if self.heartbeat is not None and self.heartbeat.in_step:
            self.heartbeat.step_done()
        if self.stage_clock is not None and self.is_last_pp_rank:
            self.stage_clock.step_ended(self._replayed())
        return output

    def _serving_step(self, what: str, serving: bool = True) -> AbstractContextManager:
        """Under PP, a failed serving step stops this worker (stage_failure.py)."""
        if serving and self.use_pp:
            return stopping_worker_on_error(self.pp_stage, what, self.replies_to_engine)
        return nullcontext()

    def update_pp_decode_requests(self) -> None:
        # vLLM applies tokens sampled pp_size steps ago; a request decoding sooner needs newer.
        heartbeat = self.heartbeat if self.heartbeat and self.heartbeat.in_step else None
        if heartbeat is not None:
            heartbeat.enter(Phase.RECEIVING_TOKENS)
        super().update_pp_decode_requests()
        if heartbeat is not None:
            heartbeat.enter(Phase.FORWARD)
        handler = self.pp_handler
        if handler is None or handler.is_last_rank or not self._step_cached_req_ids:
            return
        needed = batch_req_indices(self._step_cached_req_ids, self.req_states.req_id_to_index)
        draft_tokens = getattr(self.req_states, "draft_tokens", None)
        for outputs in consume_entries_needed_by(handler, needed, draft_tokens):
            self.postprocess_sampled(**outputs)

    def prepare_inputs(self, *args, **kwargs) -> InputBatch:
        # After graph dispatch, before vLLM copies the received tensors (the padded count).
        input_batch = super().prepare_inputs(*args, **kwargs)
        padded = input_batch.num_tokens_after_padding
        if self._received_tokens is not None:
            check_padding_agreement(self._received_tokens, padded, self.pp_stage)
        if self._pending_input is not None:
            assert self.intermediate_tensors is not None
            stage_handoff.receive_into(self._pending_input, self.intermediate_tensors.tensors,
                                       padded)
        return input_batch
