"""PPCudaGraphModelRunner's own behaviour, on a runner built without a GPU.

vLLM's runner needs CUDA to construct, so each test builds the plugin's class with
``__new__`` and sets the state the method under test reads, and stands in for the
parent method it calls.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph.worker import model_runner
from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner
from vllm_pp_cudagraph.worker.pipeline.stage_failure import EXIT_CODE, stopping_worker_on_error
from vllm_pp_cudagraph.worker.pipeline.stage_inputs import StageInputMismatchError


def bare_runner(**state) -> PPCudaGraphModelRunner:
    runner = PPCudaGraphModelRunner.__new__(PPCudaGraphModelRunner)
    runner._init_stage_state()
    runner.pp_stage = 1
    runner.__dict__.update(state)
    return runner


def desc(num_tokens: int) -> BatchExecutionDescriptor:
    return BatchExecutionDescriptor(cg_mode=None, num_tokens=num_tokens, num_reqs=None)


@pytest.fixture
def parent_prepare_inputs(monkeypatch):
    """vLLM's prepare_inputs, recorded, with the installed release's signature."""
    calls = []

    def stand_in(self, *args, **kwargs):
        calls.append((args, kwargs))
        batch_desc = next(a for a in args if isinstance(a, BatchExecutionDescriptor))
        return SimpleNamespace(num_tokens_after_padding=batch_desc.num_tokens)

    stand_in.__signature__ = inspect.signature(GPUModelRunner.prepare_inputs)
    monkeypatch.setattr(GPUModelRunner, "prepare_inputs", stand_in)
    return calls


def prepare_args(batch_desc: BatchExecutionDescriptor) -> list:
    """Positional arguments for this vLLM's prepare_inputs (its shape changed in 0.28, 0.31)."""
    values = {"scheduler_output": "so", "batch_req_state": "state", "batch_desc": batch_desc,
              "num_active_loras": 0}
    params = list(inspect.signature(GPUModelRunner.prepare_inputs).parameters)[1:]
    return [values[name] for name in params]


def test_a_sender_padded_to_another_graph_size_is_refused_naming_both(parent_prepare_inputs):
    runner = bare_runner(_received_tokens=24)
    with pytest.raises(StageInputMismatchError, match="expected 32 tokens .* sent 24"):
        runner.prepare_inputs(*prepare_args(desc(32)))


def test_matching_padding_passes_every_argument_through(parent_prepare_inputs):
    runner = bare_runner(_received_tokens=32)
    args = prepare_args(desc(32))
    assert runner.prepare_inputs(*args).num_tokens_after_padding == 32
    assert parent_prepare_inputs == [(tuple(args), {})]


def test_a_direct_hand_off_is_received_into_the_buffers_with_the_padded_count(
    parent_prepare_inputs, monkeypatch
):
    received = []
    monkeypatch.setattr(model_runner.stage_handoff, "receive_into",
                        lambda pending, buffers, n: received.append((pending, buffers, n)))
    buffers = {"hidden_states": "buffer"}
    pending = object()
    runner = bare_runner(_pending_input=pending, _received_tokens=None,
                         intermediate_tensors=SimpleNamespace(tensors=buffers))
    runner.prepare_inputs(*prepare_args(desc(48)))
    assert received == [(pending, buffers, 48)]


def test_the_first_stage_receives_nothing_and_checks_nothing(parent_prepare_inputs):
    # No received count, no pending hand-off: vLLM's batch as it is, whatever its padding.
    runner = bare_runner(_received_tokens=None, intermediate_tensors=None)
    args = prepare_args(desc(8))
    assert runner.prepare_inputs(*args).num_tokens_after_padding == 8
    assert parent_prepare_inputs == [(tuple(args), {})]


@pytest.fixture
def parent_execute_model(monkeypatch):
    """vLLM's execute_model on a later stage, as far as the received tensors go: it
    copies them into the persistent buffers by the buffers' keys (a missing key is a
    bare KeyError there). Returns the received count the plugin kept for the step."""

    def stand_in(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                 *args, **kwargs):
        n = scheduler_output.total_num_scheduled_tokens
        for key, buffer in self.intermediate_tensors.tensors.items():
            buffer[:n].copy_(intermediate_tensors[key][:n])
        return {"received_tokens": self._received_tokens}

    monkeypatch.setattr(GPUModelRunner, "execute_model", stand_in)


def later_stage_step(num_tokens: int):
    """A stage's input buffers (64 tokens) and a scheduler output for ``num_tokens``."""
    import torch
    from vllm.sequence import IntermediateTensors

    buffers = IntermediateTensors({k: torch.zeros(64, 16) for k in ("hidden_states", "residual")})
    runner = bare_runner(intermediate_tensors=buffers, tp_size=1)
    step = SimpleNamespace(total_num_scheduled_tokens=num_tokens,
                           scheduled_cached_reqs=SimpleNamespace(req_ids=["r0"]))
    return runner, step


def test_each_step_checks_the_received_tensors_before_vllm_copies_them(parent_execute_model):
    import torch
    from vllm.sequence import IntermediateTensors

    runner, step = later_stage_step(8)
    received = IntermediateTensors({"hidden_states": torch.ones(8, 16)})  # no residual
    with pytest.raises(StageInputMismatchError,
                       match=r"pipeline stage 1 received .*missing keys \['residual'\]"):
        runner._execute_step(step, received, False)
    assert not runner.intermediate_tensors["hidden_states"].any()  # nothing copied
    assert runner._received_tokens is None and runner._step_cached_req_ids is None


def test_a_step_with_matching_tensors_keeps_the_received_count_for_the_padding_check(
    parent_execute_model
):
    import torch
    from vllm.sequence import IntermediateTensors

    runner, step = later_stage_step(8)
    received = IntermediateTensors({k: torch.ones(8, 16) for k in ("hidden_states", "residual")})
    assert runner._execute_step(step, received, False) == {"received_tokens": 8}
    assert runner.intermediate_tensors["residual"][:8].all()
    assert runner._received_tokens is None  # cleared when the step ends


@pytest.fixture
def exits(monkeypatch):
    recorded = []
    monkeypatch.setattr(model_runner, "stopping_worker_on_error",
                        functools.partial(stopping_worker_on_error, exit_process=recorded.append,
                                          start_timer=lambda delay, action: action()))
    return recorded


@pytest.fixture
def failing_step(monkeypatch):
    def fail(self, *args, **kwargs):
        raise RuntimeError("step failed")

    monkeypatch.setattr(PPCudaGraphModelRunner, "_execute_step", fail)
    monkeypatch.setattr(GPUModelRunner, "sample_tokens", fail)


@pytest.mark.parametrize("backend, watched", [("mp", 1), ("ray", 0)])
def test_under_the_multiprocess_executor_a_worker_watches_its_engine_core(
        monkeypatch, backend, watched):
    """vLLM's multiprocess executor's engine core may exit leaving a stage that waits on
    a failed peer alive, holding its GPU; under Ray, Ray owns its workers' lives."""
    started = []
    monkeypatch.setattr(model_runner, "end_with_parent", lambda: started.append(1))
    runner = bare_runner(parallel_config=SimpleNamespace(distributed_executor_backend=backend))
    runner._watch_engine_core()
    assert len(started) == watched


def test_a_failing_step_under_pp_stops_the_worker(exits, failing_step):
    runner = bare_runner(use_pp=True)
    with pytest.raises(RuntimeError):
        runner.execute_model("scheduler_output")
    with pytest.raises(RuntimeError):
        runner.sample_tokens(None)
    assert exits == [EXIT_CODE, EXIT_CODE]


def test_a_failing_step_on_the_rank_vllm_reads_raises_to_the_engine_then_ends(
        exits, failing_step):
    runner = bare_runner(use_pp=True, replies_to_engine=True)
    with pytest.raises(RuntimeError, match="step failed"):
        runner.execute_model("scheduler_output")
    with pytest.raises(RuntimeError, match="step failed"):
        runner.sample_tokens(None)
    assert exits == [EXIT_CODE, EXIT_CODE]  # each after its raise, from a timer


def test_start_up_dummy_runs_and_single_stage_runs_raise_as_vllm_does(exits, failing_step):
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=True).execute_model("scheduler_output", None, True)
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=False).execute_model("scheduler_output")
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=False).sample_tokens(None)
    assert exits == []


@pytest.fixture
def token_updates(monkeypatch):
    """vLLM's postprocess_sampled, recorded, bound to the installed release's signature."""
    calls = []
    signature = inspect.signature(GPUModelRunner.postprocess_sampled)

    def stand_in(self, *args, **kwargs):
        calls.append(signature.bind(self, *args, **kwargs).arguments)

    monkeypatch.setattr(GPUModelRunner, "postprocess_sampled", stand_in)
    return calls


def first_stage(**state) -> PPCudaGraphModelRunner:
    import torch

    return bare_runner(is_last_pp_rank=False, speculative_config=None,
                       device=torch.device("cpu"), **state)


def test_first_stages_warm_up_the_received_token_update_touching_no_request(token_updates):
    first_stage()._warm_up_received_token_update()
    assert token_updates, "no warm-up of the token update"
    for call in token_updates:
        # The update kernel skips rows whose request index is negative.
        assert call["idx_mapping"].tolist() == [-1] * len(call["idx_mapping"])
        assert call.get("query_start_loc") is None and call.get("draft_tokens") is None


def test_the_warm_up_lays_tensors_out_as_the_pp_ring_receives_them(token_updates):
    import torch

    first_stage()._warm_up_received_token_update()
    rejected_alignment = set()
    for call in token_updates:
        n = len(call["idx_mapping"])
        assert call["sampled_tokens"].dtype == torch.int64
        assert tuple(call["sampled_tokens"].shape) == (n, 1)
        sampled, rejected = call["num_sampled"], call["num_rejected"]
        assert sampled.dtype == rejected.dtype == torch.int32
        assert sampled.untyped_storage().data_ptr() == rejected.untyped_storage().data_ptr()
        assert (sampled.storage_offset(), rejected.storage_offset()) == (0, n)
        rejected_alignment.add(rejected.storage_offset() * rejected.element_size() % 16 == 0)
    # Triton compiles one variant per 16-byte alignment of each pointer: both must run.
    assert rejected_alignment == {True, False}


@pytest.mark.parametrize("state", [{"is_last_pp_rank": True}, {"speculative_config": object()}],
                         ids=["last-stage", "speculative-decoding"])
def test_no_token_update_warm_up_where_the_first_stage_path_differs(state, token_updates):
    runner = first_stage()
    runner.__dict__.update(state)
    runner._warm_up_received_token_update()
    assert token_updates == []


def test_the_profiling_run_under_pp_ends_with_the_warm_up(monkeypatch, token_updates):
    order = []
    monkeypatch.setattr(GPUModelRunner, "profile_run", lambda self: order.append("vllm"))
    monkeypatch.setattr(PPCudaGraphModelRunner, "_check_stage_handoffs",
                        lambda self, produced=None: order.append("handoffs"))
    runner = first_stage(use_pp=True, _produced_schema=None)
    runner.profile_run()
    assert order == ["vllm", "handoffs"] and token_updates


def handoff_plan(direct: bool, blocker: str | None = None):
    from vllm_pp_cudagraph.shared.engine_plan import EnginePlan
    from vllm_pp_cudagraph.shared.layer_partition import Decision
    from vllm_pp_cudagraph.shared.settings import DecodeCadence, LayerPartition

    return EnginePlan(refusal=None, stand_aside=None, no_pipeline=False,
                      cadence=DecodeCadence.AUTO, asked_cadence=DecodeCadence.AUTO,
                      direct_handoff=direct, direct_handoff_blocker=blocker,
                      layer_partition=LayerPartition.VLLM, layers=None, split_decided=True,
                      partition=Decision("vllm", "vLLM's split"))


@pytest.mark.parametrize("direct, blocker, custom_send", [
    (True, None, False),                          # asked, possible: direct
    (False, None, False),                         # not asked: vLLM's hand-off
    (False, "speculative decoding", False),       # asked, the plan blocks it
    (True, None, True),                           # asked, this stage's group blocks it
])
def test_a_stage_hands_on_directly_where_its_plan_and_group_allow(direct, blocker,
                                                                  custom_send, monkeypatch):
    from vllm.distributed.parallel_state import GroupCoordinator

    group = GroupCoordinator.__new__(GroupCoordinator)
    group.use_cpu_custom_send_recv = custom_send
    monkeypatch.setattr(model_runner, "get_pp_group", lambda: group)
    runner = bare_runner(plan=handoff_plan(direct, blocker))
    runner._choose_handoff()
    expected = direct and not custom_send
    assert runner.direct_handoff is expected
    assert ("irecv_tensor_dict" in vars(group)) is expected
    assert ("isend_tensor_dict" in vars(group)) is expected


@pytest.fixture
def sampling_registrations(monkeypatch):
    """The registries handed to the vLLM surface's sampling warm-up, recorded."""
    runners = []
    monkeypatch.setattr(model_runner.vllm_surface, "register_sampling_warm_ups", runners.append)
    return runners


@pytest.mark.parametrize("last, sampler, registered", [
    (True, "sampler", True),
    (False, None, False),  # no sampler before the last stage
    (True, None, False),  # a pooling model's last stage samples nothing
], ids=["last-stage", "first-stage", "pooling"])
def test_the_last_stage_has_vllms_warm_up_compile_the_sampling_kernels(
        sampling_registrations, last, sampler, registered):
    runner = bare_runner(is_last_pp_rank=last, jit_warmup_registry="the runner's registry")
    if sampler:
        runner.sampler = sampler
    runner._register_sampling_warm_ups()
    assert sampling_registrations == (["the runner's registry"] if registered else [])


def test_loading_under_pp_registers_the_sampling_warm_ups(monkeypatch, sampling_registrations):
    monkeypatch.setattr(GPUModelRunner, "load_model", lambda self, *a, **k: None)
    for name in ("_apply_layer_split", "_check_stage_handoffs", "_start_stage_clock"):
        monkeypatch.setattr(PPCudaGraphModelRunner, name, lambda self: None)
    monkeypatch.setattr(model_runner, "write_plan_record", lambda record: None)
    plan = SimpleNamespace(record=dict)
    runner = bare_runner(use_pp=True, is_last_pp_rank=True, sampler="sampler", plan=plan,
                         jit_warmup_registry="the runner's registry")
    runner.load_model()
    assert sampling_registrations == ["the runner's registry"]


class HeldKernel:
    """A JIT kernel standing in for vLLM's top-k/top-p kernels (which register only with
    Triton on a GPU): its compile blocks until released, and says on which thread it ran."""

    def __init__(self, fails: bool = False):
        self.release = threading.Event()
        self.compiled_on: list[str] = []
        self.fails = fails

    def get_warmup_keys(self, vllm_config=None):
        return ["key"]

    def compile(self, key):  # what vLLM calls per key (up to 0.32, and compile_many's default)
        assert self.release.wait(10)
        if self.fails:
            raise RuntimeError("ptxas died")
        self.compiled_on.append(threading.current_thread().name)

    def compile_many(self, keys):
        for key in keys:
            self.compile(key)


@pytest.fixture
def held_kernel(monkeypatch):
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    kernel = HeldKernel()
    module_name, name = model_runner.vllm_surface.SAMPLING_WARM_UPS
    monkeypatch.setattr(importlib.import_module(module_name), name,
                        lambda: JitWarmupRegistry.register(kernel), raising=False)
    return kernel


def last_stage_runner(speculative_config=None) -> PPCudaGraphModelRunner:
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    return bare_runner(is_last_pp_rank=True, sampler="sampler", vllm_config=None,
                       device=torch.device("cpu"), jit_warmup_registry=JitWarmupRegistry(None),
                       speculative_config=speculative_config)


def test_the_sampling_kernels_compile_beside_the_profiling_run_and_finish_before_it_samples(
        monkeypatch, held_kernel):
    """A cold start compiles the sampler's kernels on a thread while the profiling run
    compiles the model; the profiling run's sampling waits for that compile, since vLLM's
    kernel owners hold warm-up state per call that a sampling call would read."""
    compiled_when_sampling = []
    monkeypatch.setattr(GPUModelRunner, "_dummy_sampler_run",
                        lambda self, hidden: compiled_when_sampling.append(
                            list(held_kernel.compiled_on)))
    runner = last_stage_runner()
    runner._register_sampling_warm_ups()
    assert len(runner.jit_warmup_registry) == 1  # vLLM's warm-up still holds them
    assert held_kernel.compiled_on == []  # still compiling: the load is not held up
    threading.Timer(0.2, held_kernel.release.set).start()
    runner._dummy_sampler_run(None)
    assert compiled_when_sampling == [["sampling-kernel-compile"]]
    assert runner.sampling_compile is None


def test_the_sampling_kernels_compile_for_the_stages_own_gpu(monkeypatch, held_kernel):
    """Triton compiles for, and caches under, the calling thread's current device, which a
    new thread starts at GPU 0: on a host where the last stage runs on another GPU, the
    thread must move to the stage's, or vLLM's warm-up finds nothing and compiles again."""
    set_on = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: set_on.append((device, threading.current_thread().name)))
    monkeypatch.setattr(GPUModelRunner, "_dummy_sampler_run", lambda self, hidden: None)
    runner = last_stage_runner()
    runner.device = torch.device("cuda", 1)
    held_kernel.release.set()
    runner._register_sampling_warm_ups()
    runner._dummy_sampler_run(None)
    assert set_on == [(torch.device("cuda", 1), "sampling-kernel-compile")]
    assert held_kernel.compiled_on == ["sampling-kernel-compile"]


def test_with_drafts_the_sampling_kernels_compile_in_vllms_warm_up(held_kernel):
    """Drafts sample inside the profiling run's forward pass, before its sampler: no thread
    may compile the kernels then; vLLM's warm-up compiles them, as it does for stock."""
    runner = last_stage_runner(speculative_config=object())
    runner._register_sampling_warm_ups()
    assert runner.sampling_compile is None
    assert len(runner.jit_warmup_registry) == 1


def test_a_failed_early_compile_leaves_the_kernels_to_vllms_warm_up(monkeypatch, caplog):
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    kernel = HeldKernel(fails=True)
    kernel.release.set()
    module_name, name = model_runner.vllm_surface.SAMPLING_WARM_UPS
    monkeypatch.setattr(importlib.import_module(module_name), name,
                        lambda: JitWarmupRegistry.register(kernel), raising=False)
    sampled = []
    monkeypatch.setattr(GPUModelRunner, "_dummy_sampler_run",
                        lambda self, hidden: sampled.append(True))
    runner = last_stage_runner()
    runner._register_sampling_warm_ups()
    with caplog.at_level(logging.WARNING, logger="vllm.pp_cudagraph.runner"):
        runner._dummy_sampler_run(None)
    assert sampled == [True]
    assert "ptxas died" in caplog.text and "vLLM's warm-up compiles them" in caplog.text


def test_a_stage_with_nothing_to_capture_settles_with_the_stages_that_capture(monkeypatch):
    """vLLM returns early from capture_model when a stage has no graphs to capture; the
    other stages wait for each stage's capture outcome, so this one must still report."""
    order = []
    manager = SimpleNamespace(needs_capture=lambda: False,
                              settle_with_other_stages=lambda: order.append("settled"))
    monkeypatch.setattr(GPUModelRunner, "capture_model",
                        lambda self, *a, **k: order.append("vllm") or 0)
    bare_runner(cudagraph_manager=manager).capture_model()
    assert order == ["settled", "vllm"]


def test_a_runner_left_with_vllms_own_graph_manager_refuses_to_start(monkeypatch):
    """A release that builds its manager some other way would run without the capture
    guard and the stages' graph agreement: the runner stops at start-up instead."""
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    def vllms_own(self, *args, **kwargs):
        self.cudagraph_manager = ModelCudaGraphManager.__new__(ModelCudaGraphManager)

    monkeypatch.setattr(GPUModelRunner, "initialize_kv_cache", vllms_own)
    runner = bare_runner(cudagraph_manager=None, _graph_memory_estimate=0)
    with pytest.raises(RuntimeError, match="built its own CUDA-graph manager"):
        runner.initialize_kv_cache(SimpleNamespace())


def test_no_sampling_warm_up_where_the_runner_has_no_registry(monkeypatch):
    """A runner without vLLM's JIT warm-up registry registers nothing (and says so)."""
    import importlib

    module_name, name = model_runner.vllm_surface.SAMPLING_WARM_UPS
    called = []
    monkeypatch.setattr(importlib.import_module(module_name), name,
                        lambda: called.append(True), raising=False)
    assert model_runner.vllm_surface.register_sampling_warm_ups(None) is False
    assert called == []
