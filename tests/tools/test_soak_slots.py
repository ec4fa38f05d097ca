"""The serving soak's slots and verdicts.

The soak runs its ``vllm serve`` instances on a few GPU groups, one at a time on each;
these checks pin down what each instance is given, how the pool hands out slots, and
how one mode's runs are compared and judged.
"""

from __future__ import annotations

import argparse
import threading
import time

import pytest
from _serve_parser import parse_serve_args
from test_soak_watch import first_traffic, steady

from benchmarks.tools.soak import (
    PREEMPTION_ARGS,
    Slot,
    mode_result,
    mode_servers,
    run_in_slots,
    server_spec,
    token_check_result,
)
from benchmarks.tools.soak import main as serve_soak_main
from benchmarks.tools.soak_judge import GreedyCheck
from benchmarks.tools.soak_latency import tpot_by_phase
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, engine_env
from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, RequestResult
from vllm_pp_cudagraph.commands.bench.serve_run import serve_command


def test_a_slot_gives_its_server_its_gpus_and_a_cache_of_its_own():
    slot = Slot("2,3", 8040)
    spec = slot.apply(RunSpec("plugin", "full_and_piecewise", pp=2))
    env = engine_env(spec)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["VLLM_CACHE_ROOT"].endswith("soak-cache-8040")


def test_pool_never_runs_two_servers_in_one_slot_and_keeps_task_order():
    slots = [Slot("0,1", 9000), Slot("2,3", 9010), Slot("4,5", 9100)]
    busy: dict[int, bool] = {}
    lock = threading.Lock()
    running = [0]
    peak = [0]

    def task(i):
        def run(slot):
            with lock:
                assert not busy.get(slot.port), f"slot {slot.port} handed out twice"
                busy[slot.port] = True
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                busy[slot.port] = False
                running[0] -= 1
            return {"task": i, "port": slot.port}
        return run

    results = run_in_slots([task(i) for i in range(8)], slots, stagger_s=0)
    assert [r["task"] for r in results] == list(range(8))
    assert {r["port"] for r in results} == {s.port for s in slots}
    assert peak[0] == len(slots)


def _check(max_margin: float) -> GreedyCheck:
    return GreedyCheck(5, 50, int(max_margin > 0), max_margin,
                       [(1, 2, max_margin)] if max_margin else [], [])


def test_token_check_holds_the_plugin_to_the_rounding_of_either_stock_run():
    # stock_b's outputs reach 0.05 nats below the top choice: the plugin may reach 0.1.
    ok = token_check_result({"checks": {"plugin": _check(0.09), "stock_a": _check(0.01),
                                        "stock_b": _check(0.05)}})
    assert ok["problems"] == [] and ok["plugin"]["max_margin"] == 0.09
    bad = token_check_result({"checks": {"plugin": _check(0.2), "stock_a": _check(0.01),
                                         "stock_b": _check(0.05)}})
    assert "0.200 nats" in bad["problems"][0] and "0.050" in bad["problems"][0]


def test_token_check_that_could_not_run_fails_the_mode():
    [problem] = token_check_result({"checks": {}, "error": "server exited with rc=1"})["problems"]
    assert "did not run" in problem and "rc=1" in problem
    [problem] = token_check_result({"checks": {"plugin": _check(0.0)}, "error": None})["problems"]
    assert "missing runs" in problem


def test_under_preemption_every_server_preempts_and_stock_runs_bare(tmp_path, monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    args = argparse.Namespace(preemption=True, **SOAK_MODEL)
    plugins = {}
    for runner, mode, tag in mode_servers("piecewise"):
        spec = server_spec(runner, mode, args)
        plugins[tag] = engine_env(spec)["VLLM_PLUGINS"]
        cmd = serve_command(spec, str(tmp_path), 8000, PREEMPTION_ARGS)
        parsed = parse_serve_args(cmd[cmd.index("serve") + 1:])
        assert parsed.num_gpu_blocks_override == 512
    assert plugins == {"plugin": "pp_cudagraph", "stock_a": "", "stock_b": ""}


def _served(preemptions: int, texts: list[str], watch: dict | None = None) -> dict:
    report = LoadReport([RequestResult(i, stream=False, text=t) for i, t in enumerate(texts)],
                        elapsed_s=1.0, health_checks=1, health_failures=[])
    return {"load_report": report, "load": report.summary(), "preemptions": preemptions,
            "shutdown_clean": True, "shutdown_rc": 0, "watch": watch or steady()}


#: The soak's model defaults, as its parser sets them.
SOAK_MODEL = dict(pp=2, max_num_seqs=256, shape="qwen3-0.6b", weights="random",
                  gpu_memory_utilization=0.5, lora_adapters={}, structured=False)


def _soak_args(**overrides) -> argparse.Namespace:
    args = dict(preemption=False, plugin_runner="plugin", requests=2000, max_tokens=128,
                token_check=False, **SOAK_MODEL)
    return argparse.Namespace(**(args | overrides))


def test_a_preemption_soak_fails_when_any_run_was_not_preempted():
    args = _soak_args(preemption=True)
    texts = ["a b", "c d"]
    reports = {"plugin": _served(3000, texts), "stock_a": _served(2900, texts),
               "stock_b": _served(0, texts)}
    result = mode_result("piecewise", reports, args, PREEMPTION_ARGS)
    assert not result["passed"]
    [problem] = result["problems"]
    assert problem.startswith("stock_b: no request was preempted")
    reports["stock_b"] = _served(2800, texts)
    assert mode_result("piecewise", reports, args, PREEMPTION_ARGS)["passed"]


def test_what_the_watch_saw_fails_the_plugin_and_is_reported_for_stock():
    texts = ["a b", "c d"]
    left = {**steady(), "requests_left": 2}
    reports = {"plugin": _served(0, texts), "stock_a": _served(0, texts, watch=left),
               "stock_b": _served(0, texts)}
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert result["passed"]
    assert result["watch"]["stock_a"]["requests_left"] == 2
    assert result["watch"]["stock_a"]["problems"][0].startswith("2 requests still running")
    assert result["watch"]["plugin"]["gpu_mib_start"] == {"0": 70_000, "1": 70_000}
    reports["plugin"] = _served(0, texts, watch=left)
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert not result["passed"]
    assert result["problems"] == [f"plugin: {result['watch']['plugin']['problems'][0]}"]


def test_the_plugin_fails_where_its_first_requests_took_more_memory_than_stocks():
    texts = ["a b", "c d"]
    took = {"0": 2578, "1": 2344}  # what every server took on its first requests
    reports = {name: _served(0, texts, watch=first_traffic(steady(seconds=300), took))
               for name in ("plugin", "stock_a", "stock_b")}
    assert mode_result("piecewise", reports, _soak_args(), [])["passed"]
    reports["plugin"]["watch"] = first_traffic(steady(seconds=300), {"0": 2578, "1": 4000})
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert not result["passed"]
    assert result["problems"] == [
        "plugin: GPU 1: its first 60 s of load took 4000 MiB, stock's 2344 MiB (at most 512 "
        "more)"]


def test_tpot_is_reported_apart_for_the_loads_first_minute():
    def streamed(index: int, first_token_at: float, tpot_s: float, **kwargs) -> RequestResult:
        return RequestResult(index, stream=True, chunk_times=[
            first_token_at + i * tpot_s for i in range(11)], **kwargs)

    report = LoadReport([streamed(0, 100.0, 0.2), streamed(1, 130.0, 0.1),
                         streamed(2, 161.0, 0.04), streamed(3, 200.0, 0.05),
                         streamed(4, 101.0, 9.0, cancelled=True),  # not finished: left out
                         RequestResult(5, stream=False, text="a")],
                        elapsed_s=120.0, health_checks=1, health_failures=[])
    phases = tpot_by_phase(report)
    assert phases["first_60_s"] == {"requests": 2, "p50": 150.0, "p99": 199.0}
    assert phases["after_60_s"] == {"requests": 2, "p50": 45.0, "p99": 49.9}
    texts = ["a b", "c d"]
    reports = {name: _served(0, texts) for name in ("plugin", "stock_a", "stock_b")}
    reports["plugin"]["load_report"] = report
    assert mode_result("piecewise", reports, _soak_args(), [])["plugin"][
        "tpot_ms_by_phase"] == phases


def test_a_gpu_group_must_hold_every_stage_or_share_one_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit):
        serve_soak_main(["--out", str(tmp_path / "soak"), "--pp", "4", "--gpus", "0,1"])
    assert "--gpus 0,1: each group needs --pp (4) GPUs" in capsys.readouterr().err


def test_shares_judge_a_plugin_on_its_own_cadence_only_where_no_token_check_ran():
    texts = {"plugin": ["a", "x", "y"], "stock_a": ["a", "b", "c"], "stock_b": ["a", "b", "z"]}
    reports = {name: _served(0, t) for name, t in texts.items()}
    # Without the token check the share rule is all there is, whatever the cadence.
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert not result["passed"] and "more than stock's own" in result["problems"][0]
    # The defaults decode on another cadence: with the token check, shares are reported.
    result = mode_result("piecewise", reports, _soak_args(token_check=True), [])
    assert result["passed"] and result["share_rule"].startswith("reported only")
    assert result["plugin_vs_stock"] > result["stock_vs_stock"]
    # Keeping vLLM's cadence, batches form as stock's: the share rule judges.
    result = mode_result("piecewise", reports,
                         _soak_args(token_check=True, plugin_runner="plugin-cadence"), [])
    assert not result["passed"] and result["share_rule"] == "judges"


def test_the_plugin_side_of_a_soak_can_keep_vllms_decode_cadence():
    args = argparse.Namespace(preemption=False, **SOAK_MODEL)
    [(runner, mode, tag), *_] = mode_servers("full_decode_only", plugin_runner="plugin-cadence")
    assert (runner, mode, tag) == ("plugin-cadence", "full_decode_only", "plugin")
    env = engine_env(server_spec(runner, mode, args))
    assert env["VLLM_PLUGINS"] == "pp_cudagraph"
    assert env["VLLM_PP_CUDAGRAPH_DECODE_CADENCE"] == "vllm"


def test_the_plugins_share_is_its_mean_against_both_stock_runs():
    # Four requests; the two stock runs differ in one of them.
    texts = {"stock_a": ["a", "b", "c", "d"], "stock_b": ["a", "b", "c", "x"],
             "plugin": ["a", "b", "c", "x"]}
    reports = {name: _served(0, t) for name, t in texts.items()}
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert (result["plugin_vs_stock_a"], result["plugin_vs_stock_b"]) == (0.25, 0.0)
    assert result["plugin_vs_stock"] == 0.125 and result["stock_vs_stock"] == 0.25
    assert result["passed"]
    reports["plugin"] = _served(0, ["a", "b", "y", "x"])
    result = mode_result("piecewise", reports, _soak_args(), [])
    assert result["plugin_vs_stock"] == 0.375 and not result["passed"]
    assert "more than stock's own 25.0% between its own runs" in result["problems"][0]


def test_a_big_shape_soaks_with_vllms_dummy_weights_and_the_memory_it_is_given(tmp_path, monkeypatch):
    import vllm.platforms

    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    args = argparse.Namespace(preemption=False, **(SOAK_MODEL | dict(
        shape="qwen3-32b", weights="dummy", gpu_memory_utilization=0.9)))
    spec = Slot("0,1", 8000).apply(server_spec("plugin", "full_and_piecewise", args))
    assert (spec.shape, spec.weights, spec.gpu_memory_utilization) == ("qwen3-32b", "dummy", 0.9)
    cmd = serve_command(spec, str(tmp_path), 8000)
    parsed = parse_serve_args(cmd[cmd.index("serve") + 1:])
    assert (parsed.load_format, parsed.gpu_memory_utilization) == ("dummy", 0.9)


def test_a_random_checkpoint_is_refused_for_shapes_too_big_to_write(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        serve_soak_main(["--out", str(tmp_path / "soak"), "--shape", "qwen3-32b",
                         "--weights", "random", "--modes", ""])
    assert exc.value.code == 2 and "--weights dummy" in capsys.readouterr().err
    assert not (tmp_path / "soak").exists()


def test_each_server_reports_the_plugins_graph_memory_estimate_beside_what_capture_took(tmp_path):
    from benchmarks.tools.soak import graph_memory
    from vllm_pp_cudagraph.shared.snapshots import CaptureRecord, write_snapshot

    # What each rank's graph manager records after capture (TP rank 1 of stage 0 too).
    for stage, tp_rank, estimate, took in [(0, 0, 0.42, 0.38), (0, 1, 0.5, 0.4),
                                          (1, 0, 0.47, 0.45)]:
        record = {"estimated_gib": estimate, "captured_gib": took, "graphs": {}}
        write_snapshot(CaptureRecord(f"{stage}-{tp_rank}", record), tmp_path)
    log = "\n".join([
        "(Worker_PP0 pid=1) INFO Graph capturing finished in 12 secs, took 0.38 GiB",
        "(Worker_PP1 pid=2) INFO Graph capturing finished in 13 secs, took 0.45 GiB",
    ])
    assert graph_memory(log, tmp_path) == {"estimated_gib": {0: 0.42, 1: 0.47},
                                           "captured_gib": {0: 0.38, 1: 0.45},
                                           "captured_gib_max": 0.45}
    assert graph_memory("stock has no estimate", tmp_path / "none") == {
        "estimated_gib": {}, "captured_gib": {}, "captured_gib_max": None}


def test_a_stage_whose_graphs_outgrow_the_plugins_reservation_fails_the_soak():
    from benchmarks.tools.soak import graph_memory_problems

    fits = {"estimated_gib": {0: 0.42, 1: 0.47}, "captured_gib": {0: 0.43, 1: 0.45}}
    assert graph_memory_problems(fits) == []  # 0.01 GiB is the log's rounding
    over = {"estimated_gib": {0: 0.42, 1: 0.47}, "captured_gib": {0: 0.38, 1: 0.61}}
    assert graph_memory_problems(over) == [
        "stage 1's graphs took 0.61 GiB, more than the 0.47 GiB reserved for them before "
        "the KV cache was sized"]
    # vLLM 0.29+ measures graph memory itself: no estimate, nothing to judge.
    assert graph_memory_problems({"estimated_gib": {}, "captured_gib": {0: 5.0}}) == []
    assert graph_memory_problems(None) == []


def test_a_structured_soak_serves_a_byte_vocabulary_and_fails_a_plugin_with_bad_json(
    tmp_path, monkeypatch
):
    """--structured: the servers get the byte-vocabulary model and xgrammar's settings;
    a plugin output that is not the schema's JSON fails the mode, stock's are reported."""
    import json

    import benchmarks.tools.soak as soak
    from benchmarks.tools.sampling_mix import STRUCTURED_SERVE_ARGS

    good, bad = '{"colour":"red","size":"M","ok":true}', '{"colour":"red","size":'
    served: dict[str, tuple] = {}

    def fake_serve(spec, model_dir, load, log_path, extra_args=(), **kwargs):
        served[log_path.name] = (model_dir, list(extra_args))
        text = bad if "plugin" in log_path.name else good
        results = [RequestResult(0, False, sampling="json-schema", text=text),
                   RequestResult(1, False, sampling="greedy", text="w5")]
        report = LoadReport(results, elapsed_s=1.0, health_checks=1, health_failures=[])
        return {"load_report": report, "load": report.summary(), "preemptions": 0,
                "shutdown_clean": True, "shutdown_rc": 0}

    byte_dirs = []
    monkeypatch.setattr(soak, "byte_vocab_model_dir",
                        lambda root, shape, weights: byte_dirs.append((shape, weights)) or root)
    monkeypatch.setattr(soak.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(soak, "run_serve_mode", fake_serve)
    out = tmp_path / "soak"
    rc = soak.main(["--out", str(out), "--modes", "eager", "--sampling-mix", "--structured",
                    "--gpus", "0,1", "2,3"])
    assert rc == 1
    assert byte_dirs == [("qwen3-0.6b", True)]
    assert all(args[-len(STRUCTURED_SERVE_ARGS):] == STRUCTURED_SERVE_ARGS
               for _, args in served.values())
    [mode] = json.loads((out / "soak.json").read_text())
    assert mode["structured"] is True
    assert mode["structured_checks"]["stock_a"] == {"checked": 1, "problems": 0, "first": []}
    assert mode["structured_checks"]["plugin"]["problems"] == 1
    assert any(p.startswith("plugin: request 0 (json-schema): does not parse")
               for p in mode["problems"])
