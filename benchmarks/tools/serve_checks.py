"""Serving checks of what users turn on, behind ``vllm serve``, one report each.

``structured``: the plugin's defaults serve JSON-schema and plain requests, sampled and
greedy, arriving over time, on a byte-level vocabulary (its grammar can spell JSON): every
structured answer must match its schema, no request may fail, no grammar reject a token.

``fault``: under load, a stage of the test-only ``pp_e2e_models`` model
(``tests/e2e/soak_plugins``) raises inside a step, or its worker is killed or stopped (the
stall watch must name it), or the engine core is killed. The server must exit within
``--exit-within`` seconds, leaving no process or GPU memory; the report keeps its exit
status and the log's error lines. Stock under the same fault is recorded beside it.

    python -m benchmarks.tools.serve_checks structured --out DIR [--pp 2] [--gpus 0,1] [--shape S]
    python -m benchmarks.tools.serve_checks fault --out DIR [--runner plugin|stock]
        [--stage first|last] [--ray] [--how raise|kill|stop|kill-engine] [--tp 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.tools.sampling_mix import (
    JSON_SCHEMA_FORMAT,
    STRUCTURED_SERVE_ARGS,
    schema_problems,
)
from vllm_pp_cudagraph.commands.bench.dummy_model import (
    SHAPES,
    has_random_weights,
    with_byte_vocab,
    write_byte_tokenizer,
    write_model_dir,
    write_weights,
)
from vllm_pp_cudagraph.commands.bench.engine_run import (
    RunSpec,
    engine_env,
    record_findings,
    records_dir,
    records_dir_of,
    stop_process_group,
)
from vllm_pp_cudagraph.commands.bench.serve_load import wait_until_healthy
from vllm_pp_cudagraph.commands.bench.serve_run import serve_and_call, serve_command

#: Log lines that mean a grammar saw tokens it did not allow.
GRAMMAR_REJECTIONS = ("grammar rejected tokens", "Failed to advance FSM")


def structured_requests(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Half JSON-schema requests, half plain; a third sampled with a seed."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        body: dict[str, Any] = {
            "model": "dummy",
            "messages": [{"role": "user", "content": f"item {i}: describe it as JSON"}],
            "max_tokens": 96 if i % 2 == 0 else rng.randint(16, 96),
        }
        if i % 3 == 0:
            body.update(temperature=0.8, top_p=0.9, seed=i)
        else:
            body["temperature"] = 0.0
        if i % 2 == 0:
            body["response_format"] = JSON_SCHEMA_FORMAT
        requests.append(body)
    return requests


async def send_structured(base_url: str, requests: list[dict], concurrency: int,
                          spread_s: float, seed: int = 0) -> dict[str, Any]:
    """Send ``requests`` arriving over ``spread_s`` seconds; check every answer."""
    rng = random.Random(seed)
    arrivals = sorted(rng.uniform(0, spread_s) for _ in requests)
    gate = asyncio.Semaphore(concurrency)
    problems: list[str] = []
    finish_reasons: dict[str, int] = {}
    start = time.monotonic()

    async def one(session: aiohttp.ClientSession, index: int, body: dict) -> None:
        await asyncio.sleep(max(0.0, arrivals[index] - (time.monotonic() - start)))
        async with gate:
            async with session.post(f"{base_url}/v1/chat/completions", json=body) as resp:
                payload = await resp.json(content_type=None)
        if resp.status != 200:
            problems.append(f"request {index}: HTTP {resp.status}: {str(payload)[:200]}")
            return
        choice = payload["choices"][0]
        reason = choice.get("finish_reason")
        finish_reasons[reason] = finish_reasons.get(reason, 0) + 1
        if "response_format" in body:
            problems.extend(f"request {index}: {p}" for p in
                            schema_problems(choice["message"]["content"] or ""))

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session, i, body) for i, body in enumerate(requests)))
    return {"requests": len(requests),
            "structured": sum("response_format" in r for r in requests),
            "elapsed_s": round(time.monotonic() - start, 1),
            "finish_reasons": finish_reasons, "problems": problems}


def byte_vocab_config(shape: str) -> dict[str, Any]:
    """``shape``'s config with the byte-level vocabulary."""
    return with_byte_vocab(SHAPES[shape])


def byte_vocab_model_dir(directory: str | Path, shape: str, weights: bool = False) -> Path:
    """``shape``'s model with the byte-level vocabulary; ``weights``: a random checkpoint."""
    config = byte_vocab_config(shape)
    if weights and not has_random_weights(shape):
        raise ValueError(f"{shape!r} has no random checkpoint; serve it with dummy weights")
    path = write_model_dir(directory, shape)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    write_byte_tokenizer(path, config)
    if weights:
        write_weights(path, config)
    return path


def structured_name(args: argparse.Namespace) -> str:
    """The structured report's and log's name: runner, PP size, shape unless the default."""
    shape = "" if args.shape == "qwen3-0.6b" else f"-{args.shape}"
    return f"structured-{args.runner}-pp{args.pp}{shape}"


def check_structured(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = str(byte_vocab_model_dir(tempfile.mkdtemp(prefix="structured-"), args.shape))
    spec = RunSpec(args.runner, args.mode, pp=args.pp, max_num_seqs=64,
                   weights="dummy", shape=args.shape, attention_backend="TRITON_ATTN",
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   extra_env={"CUDA_VISIBLE_DEVICES": args.gpus} if args.gpus else {})
    log_path = Path(args.out) / f"{structured_name(args)}.log"
    requests = structured_requests(args.requests)
    report = serve_and_call(
        spec, model_dir, log_path,
        lambda base_url: send_structured(base_url, requests, args.concurrency, args.spread_s),
        port=args.port, extra_args=[*STRUCTURED_SERVE_ARGS, "--max-model-len", "1024"])
    log = log_path.read_text(errors="replace")
    report["grammar_rejections"] = sum(log.count(line) for line in GRAMMAR_REJECTIONS)
    report["plugin_stages"] = record_findings(records_dir_of(log_path))["plugin_stages"]
    report["passed"] = bool(
        "error" not in report and not report.get("problems")
        and report["grammar_rejections"] == 0 and report.get("shutdown_clean")
        and report.get("requests") == args.requests
        and (args.runner != "plugin" or report["plugin_stages"] >= args.pp)
    )
    return report


#: How long after the server's exit the check waits for the processes it started to end.
LINGER_LIMIT_S = 30.0


def seconds_until_gone(pgid: int, waited: float, limit: float) -> float | None:
    """Seconds (``waited`` included) until process group ``pgid`` ends; None past ``limit``."""
    started = time.monotonic() - waited
    while _group_alive(pgid):
        if time.monotonic() - started >= limit:
            return None
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def group_processes(pgid: int) -> list[str]:
    """``"pid name"`` of each process still in process group ``pgid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, rest = stat.read_text().rpartition(")")
        except OSError:
            continue  # ended while listed
        if int(rest.split()[2]) == pgid:  # fields after the name: state, ppid, pgrp
            found.append(f"{stat.parent.name} {head.partition('(')[2]}")
    return sorted(found, key=lambda entry: int(entry.split()[0]))


def _nvidia_smi(*query: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows for ``query``, or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[field.strip() for field in line.split(",")]
            for line in out.splitlines() if line.strip()]


def gpu_memory_held(gpus: str, held_by_process: list[tuple[str, int]] | None = None
                    ) -> dict[str, int] | None:
    """MiB that processes hold on each of ``gpus`` (indices, comma-separated; all GPUs
    where empty), from nvidia-smi (``held_by_process``, one (GPU index, MiB) per process,
    stands in for it in tests); None where nvidia-smi is not there."""
    if held_by_process is None:
        gpu_rows = _nvidia_smi("--query-gpu=index,pci.bus_id")
        app_rows = None if gpu_rows is None else _nvidia_smi(
            "--query-compute-apps=gpu_bus_id,used_memory")
        if app_rows is None:
            return None
        index_of = {bus: index for index, bus in gpu_rows}
        held_by_process = [(index_of.get(bus, bus), int(mib)) for bus, mib in app_rows]
    wanted = {g.strip() for g in gpus.split(",") if g.strip()}
    held: dict[str, int] = {}
    for gpu, mib in held_by_process:
        if not wanted or gpu in wanted:
            held[gpu] = held.get(gpu, 0) + mib
    return held


def gpu_memory_of_group(pgid: int) -> int | None:
    """MiB that process group ``pgid`` holds on any GPU, or None without nvidia-smi."""
    rows = _nvidia_smi("--query-compute-apps=pid,used_memory")
    if rows is None:
        return None
    members = {entry.split()[0] for entry in group_processes(pgid)}
    return sum(int(mib) for pid, mib in rows if pid in members)


def fault_env(flag: Path, stage: str) -> dict[str, str]:
    """What the fault model reads, and has Ray copy to its workers (else only vLLM's own)."""
    names = ("PP_E2E_FAULT_FILE", "PP_E2E_FAULT_STAGE")
    return {names[0]: str(flag), names[1]: stage, "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY": ",".join(names)}


def fault_name(args: argparse.Namespace) -> str:
    """The fault report's and log's name: runner, stage, executor, how unless raise, TP
    where > 1; ``-run2`` and on where the same case already ran into ``--out``."""
    name = f"fault-{args.runner}-{args.stage}-{'ray' if args.ray else 'mp'}"
    name += "" if args.how == "raise" else f"-{args.how}"
    name += f"-tp{args.tp}" if getattr(args, "tp", 1) > 1 else ""
    run, taken = 1, {path.stem for path in Path(args.out).glob("fault-*.json")}
    while (name if run == 1 else f"{name}-run{run}") in taken:
        run += 1
    return name if run == 1 else f"{name}-run{run}"


def stage_worker_pid(records: Path, log_text: str, stage: int) -> int | None:
    """``stage``'s first TP rank's pid: from the plugin's plan record (any executor), else
    from vLLM's log prefix of its multiprocess workers (``(Worker_PP1_TP0 pid=N)``)."""
    record = records / f"plan-{stage}-0.json"
    if record.exists():
        pid = json.loads(record.read_text()).get("pid")
        if pid:
            return int(pid)
    found = re.search(rf"\(Worker(?:_DP0)?_PP{stage}(?:_TP0)? pid=(\d+)\)", log_text)
    return int(found.group(1)) if found else None


def error_lines(log_text: str, limit: int = 8) -> list[str]:
    """The log's first ERROR and CRITICAL lines: what a user watching it sees of a fault."""
    return [line.strip()[:300] for line in log_text.splitlines()
            if " ERROR " in line or " CRITICAL " in line][:limit]


def check_fault(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Serve the fault model, inject the fault mid-serving, watch how the server ends."""
    report: dict[str, Any] = {"runner": args.runner, "stage": args.stage,
                              "executor": "ray" if args.ray else "mp", "how": args.how,
                              "exit_within_s": args.exit_within}
    if not args.beside and (held := gpu_memory_held(args.gpus)):
        # An earlier case's orphans' memory would be read as this case's.
        report["error"] = f"GPUs already hold memory before the server starts: {held} MiB"
        report["passed"] = False
        return report
    model_dir = write_model_dir(tempfile.mkdtemp(prefix="fault-"), tokenizer=True)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["StageFaultQwen3ForCausalLM"]
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    flag = Path(tempfile.mkdtemp(prefix="fault-flag-")) / "now"
    # When the fault happened: the model's flag for a raise; a kill leaves the model be.
    fault_marker = flag if args.how == "raise" else flag.with_name("killed")
    spec = RunSpec(args.runner, "eager", pp=2, tp=args.tp, max_num_seqs=64, weights="dummy",
                   attention_backend="TRITON_ATTN", gpu_memory_utilization=0.4,
                   extra_env={**fault_env(flag, args.stage),
                              **({"CUDA_VISIBLE_DEVICES": args.gpus} if args.gpus else {}),
                              **({"VLLM_PP_CUDAGRAPH_STALL_LIMIT_S": str(args.stall_limit)}
                                 if args.stall_limit is not None else {})})
    env = engine_env(spec)
    env["VLLM_PLUGINS"] = ",".join(p for p in (env.get("VLLM_PLUGINS"), "pp_e2e_models") if p)
    log_path = Path(args.out) / f"{name}.log"
    records = records_dir(log_path)
    env["VLLM_PP_CUDAGRAPH_METRICS_DIR"] = str(records)
    stage_index = 0 if args.stage == "first" else spec.pp - 1
    base_url = f"http://127.0.0.1:{args.port}"
    executor = ["--distributed-executor-backend", "ray"] if args.ray else []
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(serve_command(spec, str(model_dir), args.port, executor),
                                env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            if not asyncio.run(wait_until_healthy(base_url, 600, lambda: proc.poll() is None)):
                report["error"] = f"server never healthy (rc={proc.poll()})"
                return report

            async def load() -> int:
                body = {"model": "dummy", "prompt": "w5 w6 w7", "max_tokens": 200,
                        "ignore_eos": True}
                timeout = aiohttp.ClientTimeout(total=args.exit_within + 60)
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async def one() -> str:
                        try:
                            async with session.post(f"{base_url}/v1/completions",
                                                    json=body) as r:
                                await r.read()
                                return "ok" if r.status == 200 else "error"
                        except asyncio.TimeoutError:
                            return "no answer"
                        except aiohttp.ClientError:
                            return "error"
                    tasks = [asyncio.create_task(one()) for _ in range(32)]
                    await asyncio.sleep(2.0)  # mid-serving
                    if args.how in ("kill", "stop"):
                        report["killed_pid"] = kill_stage_worker(
                            records, log_path, stage_index,
                            signal.SIGSTOP if args.how == "stop" else signal.SIGKILL)
                    elif args.how == "kill-engine":
                        report["killed_pid"] = kill_engine_core(proc.pid)
                    fault_marker.touch()
                    results = await asyncio.gather(*tasks)
                report["request_outcomes"] = {o: results.count(o) for o in set(results)}
                return results.count("ok")

            started = time.monotonic()
            loop_result: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: loop_result.update(ok=asyncio.run(load())), daemon=True)
            thread.start()
            while not fault_marker.exists() and time.monotonic() - started < 30:
                time.sleep(0.05)
            fault_at = time.monotonic()
            try:
                rc = proc.wait(timeout=args.exit_within)
                report["exit_s"], report["rc"] = round(time.monotonic() - fault_at, 1), rc
            except subprocess.TimeoutExpired:
                report["exit_s"] = report["rc"] = None
            time.sleep(3)
            report["left_running"] = _group_alive(proc.pid)
            if report["left_running"]:
                report["left_processes"] = group_processes(proc.pid)
            report["group_ended_s"] = seconds_until_gone(proc.pid, 3, LINGER_LIMIT_S)
            # Ray's workers live outside the server's process group: what still holds its GPUs.
            report["gpu_memory_held_mib"] = (
                {"server's processes": gpu_memory_of_group(proc.pid)} if args.beside
                else gpu_memory_held(args.gpus))
            thread.join(timeout=5)
            report["requests_ok"] = loop_result.get("ok")
        finally:
            if proc.poll() is None or _group_alive(proc.pid):
                try:
                    os.killpg(proc.pid, signal.SIGINT)
                    proc.wait(timeout=30)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    stop_process_group(proc)
    log = log_path.read_text(errors="replace")
    report["error_lines"] = error_lines(log)
    # vLLM's API server exits 0 once its engine is dead: what counts is a prompt, clean exit.
    stopped = (report.get("exit_s") is not None and report["group_ended_s"] is not None
               and not any((report["gpu_memory_held_mib"] or {}).values()))
    if args.how == "raise":
        report["fault_in_log"] = f"injected fault on the {args.stage} stage" in log
        report["stage_stop_in_log"] = f"Pipeline stage {stage_index} failed in execute_model" in log
        report["passed"] = bool(stopped and report["fault_in_log"])
    elif args.how == "stop":
        report["stuck_stage_named"] = (f"pipeline stage {stage_index} (TP rank" in log
                                       and "is stuck" in log)
        report["answered_every_request"] = "no answer" not in report.get("request_outcomes", {})
        report["passed"] = bool(stopped and report.get("killed_pid") and report["stuck_stage_named"]
                                and report["answered_every_request"])
    else:
        report["passed"] = bool(stopped and report.get("killed_pid"))
    return report


def _kill(pid: int, sig: int) -> int | None:
    """Send ``sig`` to ``pid``; ``pid``, or None where it had already ended."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return None
    return pid


def kill_stage_worker(records: Path, log_path: Path, stage: int,
                      sig: int = signal.SIGKILL) -> int | None:
    """Send ``sig`` (SIGKILL) to ``stage``'s worker; its pid, or None where it was not found."""
    pid = stage_worker_pid(records, log_path.read_text(errors="replace"), stage)
    return None if pid is None else _kill(pid, sig)


def kill_engine_core(pgid: int) -> int | None:
    """SIGKILL the engine core in process group ``pgid``; its pid, or None where not found."""
    for entry in group_processes(pgid):
        pid, _, name = entry.partition(" ")
        if name.startswith("VLLM::EngineCor"):  # /proc keeps 15 characters of a name
            return _kill(int(pid), signal.SIGKILL)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("check", choices=("structured", "fault"), help="which check to run")
    parser.add_argument("--out", required=True, help="directory for the report and logs")
    parser.add_argument("--runner", default="plugin", help="plugin, stock, ... (engine_run.RUNNERS)")
    parser.add_argument("--gpus", default="", help="CUDA_VISIBLE_DEVICES for the server")
    parser.add_argument("--port", type=int, default=8000, help="port of the server")
    structured = parser.add_argument_group("structured")
    structured.add_argument("--mode", default="full_and_piecewise", help="graph mode")
    structured.add_argument("--pp", type=int, default=2, help="pipeline-parallel size")
    structured.add_argument("--requests", type=int, default=200, help="requests to send")
    structured.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    structured.add_argument("--spread-s", type=float, default=20.0,
                            help="arrivals spread over this many seconds")
    structured.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES),
                            help="model shape, served with a byte-level vocabulary")
    structured.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                            help="vLLM's gpu_memory_utilization (big shapes need more)")
    fault = parser.add_argument_group("fault")
    fault.add_argument("--exit-within", type=float, default=30.0,
                       help="seconds the server has to exit after the fault")
    fault.add_argument("--stage", choices=("first", "last"), default="first",
                       help="the stage that fails")
    fault.add_argument("--ray", action="store_true",
                       help="serve with --distributed-executor-backend ray")
    fault.add_argument("--how", choices=("raise", "kill", "stop", "kill-engine"), default="raise",
                       help="the stage raises inside a step, or its worker is killed, or "
                            "stopped (SIGSTOP), or the engine core is killed")
    fault.add_argument("--tp", type=int, default=1, help="TP ranks per stage")
    fault.add_argument("--beside", action="store_true", help="another server shares the "
                       "GPUs: count only the memory this server's processes hold")
    fault.add_argument("--stall-limit", type=float, default=None,
                       help="VLLM_PP_CUDAGRAPH_STALL_LIMIT_S for the server")
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.check == "structured":
        name, report = structured_name(args), check_structured(args)
    else:
        name = fault_name(args)  # before the run: its log takes its report's name
        report = check_fault(args, name)
    (Path(args.out) / f"{name}.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "problems"}, default=str))
    for problem in report.get("problems", [])[:20]:
        print("  ", problem)
    return 0 if report.get("passed") or args.runner != "plugin" else 1


if __name__ == "__main__":
    raise SystemExit(main())
