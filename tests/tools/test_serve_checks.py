"""The structured-output and fault checks judge what they should."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading

from _local_server import local_server
from aiohttp import web

from benchmarks.tools import serve_checks
from benchmarks.tools.sampling_mix import SCHEMA, schema_problems
from benchmarks.tools.serve_checks import (
    byte_vocab_model_dir,
    error_lines,
    fault_env,
    gpu_memory_held,
    group_processes,
    kill_stage_worker,
    seconds_until_gone,
    send_structured,
    stage_worker_pid,
    structured_requests,
)
from benchmarks.tools.serve_checks import main as serve_checks_main


def test_requests_mix_schema_and_plain_greedy_and_seeded():
    requests = structured_requests(12)
    assert sum("response_format" in r for r in requests) == 6
    assert requests[0]["response_format"]["json_schema"]["schema"] == SCHEMA
    assert {r["temperature"] for r in requests} == {0.0, 0.8}
    assert all("seed" in r for r in requests if r["temperature"] > 0)


def test_schema_check_tells_valid_from_truncated_and_wrong():
    assert schema_problems('{"colour":"red","size":"M","ok":true}') == []
    assert "does not parse" in schema_problems('{"colour":"red","size":')[0]
    assert "is not one of" in schema_problems('{"colour":"pink","size":"M","ok":true}')[0]
    assert "does not match" in schema_problems('{"colour":"red","size":"M"}')[0]


def test_every_structured_answer_is_checked_and_errors_are_reported():
    answers = iter(['{"colour":"red","size":"S","ok":false}', '{"colour":"red"'])

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if "response_format" not in body:
            return web.json_response({"error": "boom"}, status=500)
        text = next(answers)
        return web.json_response({"choices": [{"message": {"content": text},
                                               "finish_reason": "stop"}]})

    async def run() -> dict:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with local_server(app) as base_url:
            return await send_structured(base_url, structured_requests(3), 2, 0.1)

    report = asyncio.run(run())
    assert report["requests"] == 3 and report["structured"] == 2
    # Only the answers that came back are counted as finished; the failed one is a problem.
    assert report["finish_reasons"] == {"stop": 2}
    # One problem per bad answer, each naming its request: the plain request 1 got
    # HTTP 500, one of the structured requests (0, 2) sent truncated JSON; the
    # valid answer adds nothing.
    http, parse = sorted(report["problems"], key=lambda p: "HTTP" not in p)
    assert http.startswith("request 1: HTTP 500: ") and "boom" in http
    assert re.fullmatch(r"request [02]: .*does not parse.*", parse, re.S)


def test_the_fault_reaches_ray_workers_and_names_its_stage(tmp_path):
    env = fault_env(tmp_path / "now", "last")
    assert env["PP_E2E_FAULT_STAGE"] == "last"
    # Ray copies only vLLM's own variables to its workers unless told to.
    assert set(env["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"].split(",")) == {
        "PP_E2E_FAULT_FILE", "PP_E2E_FAULT_STAGE"}


def test_a_fault_stage_other_than_first_or_last_is_refused(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        serve_checks_main(["fault", "--out", str(tmp_path), "--stage", "middle"])
    assert exc.value.code == 2 and "--stage" in capsys.readouterr().err


def test_any_shape_gets_the_byte_vocabulary_so_its_grammar_can_spell_json(tmp_path):
    from transformers import AutoTokenizer

    from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES

    small = json.loads((byte_vocab_model_dir(tmp_path / "s", "qwen3-0.6b") / "config.json").read_text())
    assert small == SHAPES["qwen3-0.6b-bytes"]
    path = byte_vocab_model_dir(tmp_path / "big", "qwen3-32b")
    config = json.loads((path / "config.json").read_text())
    assert config == {**SHAPES["qwen3-32b"], "vocab_size": 512, "bos_token_id": 256,
                      "eos_token_id": 257}
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    ids = tokenizer.encode('{"ok":true}', add_special_tokens=False)
    assert max(ids) < 256 and tokenizer.decode(ids) == '{"ok":true}'


def test_a_stage_is_killed_through_the_pid_its_plan_record_names(tmp_path, monkeypatch):
    """The plugin's runner writes its process into each rank's plan record, so the kill
    check finds a stage's worker under any executor, and kills that process."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from vllm_pp_cudagraph.shared import snapshots
    from vllm_pp_cudagraph.worker import model_runner

    monkeypatch.setenv(snapshots.METRICS_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(model_runner, "get_tp_group", lambda: SimpleNamespace(rank_in_group=0))
    monkeypatch.setattr(model_runner, "get_pp_group", lambda: SimpleNamespace(rank_in_group=1))
    model_runner.write_plan_record({"plugin_runner": True})
    assert stage_worker_pid(tmp_path, "", stage=1) == os.getpid()
    assert stage_worker_pid(tmp_path, "", stage=0) is None

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    record = tmp_path / "plan-1-0.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "pid": worker.pid}))
    log = tmp_path / "server.log"
    log.write_text("")
    assert kill_stage_worker(tmp_path, log, stage=1) == worker.pid
    assert worker.wait(timeout=10) == -9


def test_stocks_stage_worker_is_found_by_vllms_log_prefix(tmp_path):
    """Without the plugin's records, vLLM's decoration of its multiprocess workers' lines
    names the stage (with a TP rank where TP > 1); a line of another stage does not count."""
    log = ("(Worker pid=11) INFO loading\n(Worker_PP0 pid=11) INFO ready\n"
           "(Worker_PP1_TP1 pid=14) INFO ready\n(Worker_PP1_TP0 pid=13) INFO ready\n")
    assert stage_worker_pid(tmp_path, log, stage=1) == 13
    assert stage_worker_pid(tmp_path, log, stage=0) == 11
    assert stage_worker_pid(tmp_path, log, stage=2) is None


def test_the_report_keeps_the_error_lines_a_user_sees():
    log = ("(APIServer pid=1) INFO 11-27 04:00:00 [api_server.py:1] ok\n"
           "(EngineCore pid=2) ERROR 11-27 04:00:01 [core.py:9] Worker proc VllmWorker-1 died\n"
           "(APIServer pid=1) ERROR 11-27 04:00:01 [async_llm.py:5] EngineDeadError\n")
    assert error_lines(log) == [
        "(EngineCore pid=2) ERROR 11-27 04:00:01 [core.py:9] Worker proc VllmWorker-1 died",
        "(APIServer pid=1) ERROR 11-27 04:00:01 [async_llm.py:5] EngineDeadError"]


def test_a_fault_report_says_how_long_the_servers_processes_outlived_it():
    lingering = subprocess.Popen(["sleep", "1.5"], start_new_session=True)
    reaper = threading.Thread(target=lingering.wait)  # reaped as it ends, as init would
    reaper.start()
    gone = seconds_until_gone(lingering.pid, 0, 10)
    reaper.join()
    assert gone is not None and 1.0 <= gone < 10
    stuck = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert seconds_until_gone(stuck.pid, 0, 1.0) is None
    finally:
        stuck.kill()
        stuck.wait()


def test_a_fault_report_names_the_processes_left_in_the_servers_group():
    left = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_processes(left.pid) == [f"{left.pid} sleep"]
    finally:
        left.kill()
        left.wait()
    assert group_processes(left.pid) == []


def test_a_fault_report_counts_only_the_memory_held_on_the_servers_gpus():
    apps = [("0", 59080), ("1", 59510), ("2", 1200), ("0", 20)]
    assert gpu_memory_held("0,1", apps) == {"0": 59100, "1": 59510}
    assert gpu_memory_held("3", apps) == {}
    assert gpu_memory_held("", apps) == {"0": 59100, "1": 59510, "2": 1200}


def stand_in_nvidia_smi(folder, monkeypatch, gpus: str, apps: str) -> None:
    """An nvidia-smi first on PATH that lists ``gpus`` (index, bus) and ``apps`` (bus, MiB)."""
    fake = folder / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\ncase "$1" in\n  --query-gpu=*) printf "{gpus}" ;;\n'
                    f'  *) printf "{apps}" ;;\nesac\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


def test_the_memory_held_is_read_from_nvidia_smi_by_gpu_index(tmp_path, monkeypatch):
    stand_in_nvidia_smi(tmp_path, monkeypatch, "0, 00000000:18:00.0\\n1, 00000000:2A:00.0\\n",
                        "00000000:2A:00.0, 59510\\n")
    assert gpu_memory_held("0,1") == {"1": 59510}


def test_a_fault_case_is_not_run_on_gpus_something_else_holds(tmp_path, monkeypatch):
    """Memory an earlier case's orphans hold would be read as this case's."""
    (tmp_path / "bin").mkdir()
    stand_in_nvidia_smi(tmp_path / "bin", monkeypatch, "0, 00000000:18:00.0\\n",
                        "00000000:18:00.0, 58592\\n")

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started on GPUs that were not free")

    monkeypatch.setattr(serve_checks, "serve_command", no_server)
    assert serve_checks_main(["fault", "--out", str(tmp_path / "out"), "--gpus", "0",
                              "--stage", "last"]) == 1
    report = json.loads((tmp_path / "out" / "fault-plugin-last-mp.json").read_text())
    assert report["passed"] is False and "58592" in report["error"]


def test_a_fault_case_run_again_keeps_the_first_runs_report_and_log(tmp_path):
    import argparse

    from benchmarks.tools.serve_checks import fault_name

    args = argparse.Namespace(out=str(tmp_path), runner="plugin", stage="last", ray=False,
                              how="raise")
    assert fault_name(args) == "fault-plugin-last-mp"
    (tmp_path / "fault-plugin-last-mp.json").write_text("{}")
    assert fault_name(args) == "fault-plugin-last-mp-run2"
    (tmp_path / "fault-plugin-last-mp-run2.json").write_text("{}")
    assert fault_name(args) == "fault-plugin-last-mp-run3"
    args.how = "kill"
    assert fault_name(args) == "fault-plugin-last-mp-kill"


def test_the_engine_core_is_found_by_vllms_process_name_and_killed_alone():
    import signal
    import sys

    from benchmarks.tools.serve_checks import kill_engine_core

    # A server that starts an engine core in its process group, as vLLM's API server does.
    engine = ("import time; open('/proc/self/comm', 'w').write('VLLM::EngineCore'); "
              "print(flush=True); time.sleep(60)")
    server = ("import subprocess, sys, time; "
              f"e = subprocess.Popen([sys.executable, '-c', {engine!r}], stdout=subprocess.PIPE); "
              "e.stdout.readline(); print(e.pid, flush=True); print(e.wait(), flush=True)")
    proc = subprocess.Popen([sys.executable, "-c", server], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        engine_pid = int(proc.stdout.readline())
        assert kill_engine_core(proc.pid) == engine_pid
        assert int(proc.stdout.readline()) == -signal.SIGKILL  # the engine core, killed
        assert kill_engine_core(proc.pid) is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
