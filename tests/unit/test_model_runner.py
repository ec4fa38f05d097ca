"""PPCudaGraphModelRunner's own behaviour, on a runner built without a GPU.

vLLM's runner needs CUDA to construct, so each test builds the plugin's class with
``__new__`` and sets the state the method under test reads, and stands in for the
parent method it calls.
"""

from __future__ import annotations

import functools
import inspect

import pytest
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph import model_runner
from vllm_pp_cudagraph.model_runner import PPCudaGraphModelRunner
from vllm_pp_cudagraph.stage_failure import EXIT_CODE, stopping_worker_on_error
from vllm_pp_cudagraph.stage_inputs import StageInputMismatchError


def bare_runner(**state) -> PPCudaGraphModelRunner:
    runner = PPCudaGraphModelRunner.__new__(PPCudaGraphModelRunner)
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
        return "batch"

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
    assert parent_prepare_inputs == []


def test_matching_padding_passes_every_argument_through(parent_prepare_inputs):
    runner = bare_runner(_received_tokens=32)
    args = prepare_args(desc(32))
    assert runner.prepare_inputs(*args) == "batch"
    assert parent_prepare_inputs == [(tuple(args), {})]


def test_the_first_stage_receives_nothing_and_checks_nothing(parent_prepare_inputs):
    runner = bare_runner(_received_tokens=None)
    runner.prepare_inputs(*prepare_args(desc(8)))
    assert len(parent_prepare_inputs) == 1


@pytest.fixture
def exits(monkeypatch):
    recorded = []
    monkeypatch.setattr(model_runner, "stopping_worker_on_error",
                        functools.partial(stopping_worker_on_error, exit_process=recorded.append))
    return recorded


@pytest.fixture
def failing_step(monkeypatch):
    def fail(self, *args, **kwargs):
        raise RuntimeError("step failed")

    monkeypatch.setattr(PPCudaGraphModelRunner, "_execute_step", fail)
    monkeypatch.setattr(GPUModelRunner, "sample_tokens", fail)


def test_a_failing_step_under_pp_stops_the_worker(exits, failing_step):
    runner = bare_runner(use_pp=True)
    with pytest.raises(RuntimeError):
        runner.execute_model("scheduler_output")
    with pytest.raises(RuntimeError):
        runner.sample_tokens(None)
    assert exits == [EXIT_CODE, EXIT_CODE]


def test_start_up_dummy_runs_and_single_stage_runs_raise_as_vllm_does(exits, failing_step):
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=True).execute_model("scheduler_output", None, True)
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=False).execute_model("scheduler_output")
    with pytest.raises(RuntimeError, match="step failed"):
        bare_runner(use_pp=False).sample_tokens(None)
    assert exits == []
