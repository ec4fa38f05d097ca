"""The engine core refuses an engine whose workers cannot follow its plan."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from _scheduler import make_scheduler
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from vllm_pp_cudagraph.engine_core import engine_check
from vllm_pp_cudagraph.engine_core.engine_check import WorkerRunnerError, check_workers, plan_of
from vllm_pp_cudagraph.shared.engine_plan import PLUGIN_SCHEDULER, EngineFacts, plan_engine
from vllm_pp_cudagraph.shared.settings import DecodeCadence, LayerPartition, PPCudaGraphSettings

AUTO = DecodeCadence.AUTO


def plan(config, cadence, partition=LayerPartition.VLLM):
    """The engine's plan under these two settings (the others at their defaults)."""
    return plan_engine(PPCudaGraphSettings(decode_cadence=cadence, layer_partition=partition),
                       EngineFacts.of(config))


@pytest.fixture
def config(tmp_path, monkeypatch):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    scheduler = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=2)
    config = scheduler.vllm_config
    # As the API server names it with the plugin enabled (patches.py, scheduler-class).
    config.scheduler_config.scheduler_cls = PLUGIN_SCHEDULER
    # MRV2 needs Triton; on this CPU the config would pick V1 (see _scheduler.py).
    monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
    return config


def rpc_answering(records):
    calls = []

    def collective_rpc(fn):
        calls.append(fn)
        return list(records)

    return collective_rpc, calls


#: A worker that runs vLLM's own runner answers None.
STOCK = None


def ours(config, cadence=AUTO, partition=LayerPartition.VLLM, **changed):
    """What a worker running the plugin's runner answers (its plan's record)."""
    return {**plan(config, cadence, partition).record(), **changed}


def test_a_worker_without_the_plugins_runner_is_refused_by_rank(config):
    assert config.scheduler_config.get_scheduler_cls().__mro__[1] is AsyncScheduler
    rpc, _ = rpc_answering([ours(config), STOCK])
    with pytest.raises(WorkerRunnerError, match=r"worker 1: vLLM's own runner.*DECODE_CADENCE=vllm"):
        check_workers(config, rpc, plan(config, AUTO))


def test_workers_with_the_plugins_runner_pass(config):
    rpc, calls = rpc_answering([ours(config), ours(config)])
    check_workers(config, rpc, plan(config, AUTO))
    assert calls == [plan_of]


@pytest.mark.parametrize("cadence", [DecodeCadence.MERGE, DecodeCadence.FILL, AUTO])
def test_every_worker_without_the_package_is_refused_under_a_lifting_cadence(config, cadence):
    """merge and fill let a request decode sooner than vLLM's cadence, and auto may choose
    merge: a worker on vLLM's runner would serve stale tokens."""
    rpc, _ = rpc_answering([STOCK, STOCK])
    with pytest.raises(WorkerRunnerError, match="worker 0: .*worker 1: .*stale tokens"):
        check_workers(config, rpc, plan(config, cadence))


def test_on_vllms_cadence_stock_workers_are_not_refused(config, caplog):
    rpc, _ = rpc_answering([STOCK, STOCK])
    check_workers(config, rpc, plan(config, DecodeCadence.VLLM))
    assert "vllm-pp-cudagraph stands aside for this engine (PP=2 x TP=1)" in caplog.text


def test_without_async_scheduling_the_cadence_is_vllms_and_nothing_is_refused(config,
                                                                             monkeypatch):
    # The cadence hook wraps the async scheduler only; the sync one keeps vLLM's cadence.
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setattr(type(config.scheduler_config), "get_scheduler_cls",
                        lambda self: Scheduler)
    assert plan(config, AUTO).cadence is DecodeCadence.VLLM
    rpc, _ = rpc_answering([ours(config), STOCK])
    check_workers(config, rpc, plan(config, AUTO))


@pytest.mark.parametrize("pp", [2, 4])
def test_where_the_cadence_only_delays_stock_workers_are_not_refused(tmp_path, monkeypatch, pp):
    """balance never lets a request decode sooner, so workers without the plugin serve right."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    config = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=pp).vllm_config
    monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
    rpc, _ = rpc_answering([STOCK] * pp)
    check_workers(config, rpc, plan(config, DecodeCadence.BALANCE))


def test_one_line_says_the_plugin_is_active_with_its_layout_cadence_and_graphs(config,
                                                                             caplog):
    import logging

    caplog.set_level(logging.INFO, logger="vllm.pp_cudagraph.engine_check")
    rpc, _ = rpc_answering([ours(config), ours(config)])
    check_workers(config, rpc, plan(config, AUTO))
    lines = [r.getMessage() for r in caplog.records if "vllm-pp-cudagraph" in r.getMessage()]
    mode = config.compilation_config.cudagraph_mode
    assert lines == [f"vllm-pp-cudagraph active on all 2 workers (PP=2 x TP=1): decode "
                     f"cadence auto (VLLM_PP_CUDAGRAPH_DECODE_CADENCE=auto), CUDA graphs {mode}"]


def test_an_engine_the_plugin_stands_aside_for_says_why(config, caplog, monkeypatch):
    monkeypatch.setattr(config, "kv_transfer_config",
                        type("KV", (), {"kv_connector": "SharedStorageConnector"})())
    assert plan(config, AUTO).cadence is DecodeCadence.VLLM
    rpc, _ = rpc_answering([STOCK, STOCK])
    check_workers(config, rpc, plan(config, AUTO))
    assert ("stands aside for this engine (PP=2 x TP=1): KV connector "
            "'SharedStorageConnector' is not yet run on a GPU") in caplog.text


def test_a_refusal_shuts_the_workers_down_before_raising(config):
    class Executor:
        shut_down = False

        def collective_rpc(self, fn):
            return [STOCK] * 2

        def shutdown(self):
            self.shut_down = True

    class Core:
        vllm_config = config
        model_executor = Executor()

    init = engine_check.wrap_initialize_kv_caches(lambda self: "kv-config",
                                                  PPCudaGraphSettings(decode_cadence=AUTO))
    with pytest.raises(WorkerRunnerError):
        init(Core())
    assert Core.model_executor.shut_down


def test_the_probe_runs_on_a_worker_that_lacks_this_package():
    """It travels by value, as the check sends it: a worker without the plugin
    must answer that it runs vLLM's runner, not fail to import the probe."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(engine_check)
    try:
        payload = cloudpickle.dumps(plan_of)
    finally:
        cloudpickle.unregister_pickle_by_value(engine_check)
    script = (
        "import pickle, sys, types\n"
        "sys.modules['vllm_pp_cudagraph'] = None  # not installed on this worker\n"
        "probe = pickle.loads(sys.stdin.buffer.read())\n"
        "class GPUModelRunner: pass\n"
        "print(probe(types.SimpleNamespace(model_runner=GPUModelRunner())))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], input=payload,
                         capture_output=True, check=True).stdout.decode().strip()
    assert out == "None"
    with pytest.raises(Exception):  # by reference it would need the package
        subprocess.run([sys.executable, "-c", script], input=pickle.dumps(plan_of),
                       capture_output=True, check=True)


def test_auto_partition_refuses_stock_workers_beside_a_split_of_its_own(config):
    rpc, _ = rpc_answering([ours(config, split_source="auto", layers=[15, 13]), STOCK])
    with pytest.raises(WorkerRunnerError, match=r"worker 1: vLLM's own runner.*split \[15, 13\]"
                       r".*some layers would run twice.*LAYER_PARTITION=vllm"):
        check_workers(config, rpc, plan(config, DecodeCadence.BALANCE, LayerPartition.AUTO))


def test_workers_that_chose_different_splits_are_refused(config):
    rpc, _ = rpc_answering([ours(config, layers=[15, 13]), ours(config, layers=[14, 14])])
    with pytest.raises(WorkerRunnerError, match="different layer splits.*by hand"):
        check_workers(config, rpc, plan(config, DecodeCadence.BALANCE, LayerPartition.AUTO))


def test_stock_workers_beside_ones_that_kept_vllms_split_pass(config):
    rpc, _ = rpc_answering([ours(config, partition=LayerPartition.AUTO), STOCK])
    check_workers(config, rpc, plan(config, DecodeCadence.BALANCE, LayerPartition.AUTO))


def test_without_a_pipeline_stock_workers_are_expected_and_said_at_info(tmp_path, monkeypatch,
                                                                         caplog):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    config = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=1).vllm_config
    rpc, _ = rpc_answering([STOCK])
    with caplog.at_level("INFO", logger="vllm.pp_cudagraph.engine_check"):
        check_workers(config, rpc, plan(config, AUTO, LayerPartition.AUTO))
    (record,) = [r for r in caplog.records if "stands aside for this engine" in r.getMessage()]
    assert record.levelname == "INFO" and "no pipeline (PP=1)" in record.getMessage()


def test_the_engine_check_the_scheduler_and_a_worker_plan_the_engine_alike(tmp_path):
    """Each process plans its engine from the same config and settings: the engine check's
    plan, the one the plugin's scheduler holds and a worker's (with its GPU's memory)."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    settings = PPCudaGraphSettings(decode_cadence=AUTO)
    scheduler = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)), pp=2,
                               settings=settings)
    config = scheduler.vllm_config
    config.scheduler_config.scheduler_cls = PLUGIN_SCHEDULER  # as the API server names it
    checked = plan_engine(settings, EngineFacts.of(config))
    worker = plan_engine(settings, EngineFacts.of(config), gpu_memory_bytes=141 << 30)
    assert scheduler.plan.record() == checked.record() == worker.record()
    assert scheduler.cadence is AUTO and scheduler.chooser is not None
