"""The engine core refuses to change the decode cadence for workers that cannot follow."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from _scheduler import make_scheduler
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from vllm_pp_cudagraph import engine_check
from vllm_pp_cudagraph.engine_check import (
    PLUGIN_RUNNER,
    WorkerRunnerError,
    check_workers,
    runner_class_of,
)
from vllm_pp_cudagraph.settings import DecodeCadence

AUTO = DecodeCadence.AUTO


@pytest.fixture
def config(tmp_path, monkeypatch):
    from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

    scheduler = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=2)
    config = scheduler.vllm_config
    # MRV2 needs Triton; on this CPU the config would pick V1 (see _scheduler.py).
    monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
    return config


def rpc_answering(classes):
    calls = []

    def collective_rpc(fn):
        calls.append(fn)
        return list(classes)

    return collective_rpc, calls


def test_a_worker_without_the_plugins_runner_is_refused_by_rank(config):
    assert config.scheduler_config.get_scheduler_cls() is AsyncScheduler
    stock = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
    rpc, _ = rpc_answering([PLUGIN_RUNNER, stock])
    with pytest.raises(WorkerRunnerError, match=r"worker 1: vllm\.v1.*DECODE_CADENCE=vllm"):
        check_workers(config, rpc, AUTO)


def test_workers_with_the_plugins_runner_pass(config):
    rpc, calls = rpc_answering([PLUGIN_RUNNER, PLUGIN_RUNNER])
    check_workers(config, rpc, AUTO)
    assert calls == [runner_class_of]


def test_on_vllms_cadence_no_worker_is_asked(config):
    rpc, calls = rpc_answering(["anything"])
    check_workers(config, rpc, DecodeCadence.VLLM)
    assert calls == []


def test_without_async_scheduling_no_worker_is_asked(config, monkeypatch):
    # The cadence hook wraps the async scheduler only; the sync one keeps vLLM's cadence.
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setattr(type(config.scheduler_config), "get_scheduler_cls",
                        lambda self: Scheduler)
    rpc, calls = rpc_answering(["anything"])
    check_workers(config, rpc, AUTO)
    assert calls == []


@pytest.mark.parametrize("pp", [2, 4])
def test_where_the_cadence_only_delays_no_worker_is_asked(tmp_path, monkeypatch, pp):
    """balance never lets a request decode sooner, so workers without the plugin serve right."""
    from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

    config = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=pp).vllm_config
    monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
    rpc, calls = rpc_answering(["vllm.v1.worker.gpu.model_runner.GPUModelRunner"] * pp)
    check_workers(config, rpc, DecodeCadence.BALANCE)
    assert calls == []


def test_a_refusal_shuts_the_workers_down_before_raising(config):
    class Executor:
        shut_down = False

        def collective_rpc(self, fn):
            return ["vllm.v1.worker.gpu_model_runner.GPUModelRunner"] * 2

        def shutdown(self):
            self.shut_down = True

    class Core:
        vllm_config = config
        model_executor = Executor()

    init = engine_check.checking_workers(lambda self: "kv-config", AUTO)
    with pytest.raises(WorkerRunnerError):
        init(Core())
    assert Core.model_executor.shut_down


def test_the_probe_runs_on_a_worker_that_lacks_this_package():
    """It travels by value, as the check sends it: a worker without the plugin
    must answer with its runner class, not fail to import the probe."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(engine_check)
    try:
        payload = cloudpickle.dumps(runner_class_of)
    finally:
        cloudpickle.unregister_pickle_by_value(engine_check)
    script = (
        "import pickle, sys, types\n"
        "sys.modules['vllm_pp_cudagraph'] = None  # not installed on this worker\n"
        "probe = pickle.loads(sys.stdin.buffer.read())\n"
        "class GPUModelRunner: pass\n"
        "GPUModelRunner.__module__ = 'vllm.v1.worker.gpu.model_runner'\n"
        "print(probe(types.SimpleNamespace(model_runner=GPUModelRunner())))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], input=payload,
                         capture_output=True, check=True).stdout.decode().strip()
    assert out == "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
    with pytest.raises(Exception):  # by reference it would need the package
        subprocess.run([sys.executable, "-c", script], input=pickle.dumps(runner_class_of),
                       capture_output=True, check=True)
