"""Run one runner / graph mode behind ``vllm serve`` and load it.

Starts ``vllm serve`` on a built-in model shape with a generated tokenizer in its
own process group (log streamed to a file), waits for ``/health``, sends the
load (:mod:`vllm_pp_cudagraph.commands.bench.serve_load`) or any other client call, then stops
the server with SIGINT and records whether it shut down cleanly.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from vllm_pp_cudagraph.commands.bench import lanes
from vllm_pp_cudagraph.commands.bench.engine_run import (
    MODES,
    RunSpec,
    engine_env,
    log_findings,
    mode_options,
    profiler_settings,
    record_findings,
    records_dir,
    records_dir_of,
    spec_record,
    stop_process_group,
)
from vllm_pp_cudagraph.commands.bench.serve_load import (
    LoadSpec,
    completed_texts,
    fetch_preemptions,
    run_load,
    wait_until_healthy,
)
from vllm_pp_cudagraph.commands.bench.stats import median_run, output_digest
from vllm_pp_cudagraph.commands.bench.trace_analysis import analyze_dir, stage_busy
from vllm_pp_cudagraph.shared.snapshots import StageSnapshot, read_stage_snapshots


def mode_cli_args(mode: str | RunSpec) -> list[str]:
    """``vllm serve`` flags for a graph mode, or a run's (the CLI form of its engine
    kwargs: :func:`~vllm_pp_cudagraph.commands.bench.engine_run.mode_options`)."""
    args: list[str] = []
    options = MODES[mode][0] if isinstance(mode, str) else mode_options(mode)
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def serve_command(
    spec: RunSpec, model_dir: str, port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
        "--served-model-name", "dummy",
        "--load-format", "dummy" if spec.weights == "dummy" else "auto",
        "--pipeline-parallel-size", str(spec.pp),
        "--tensor-parallel-size", str(spec.tp),
        "--max-num-seqs", str(spec.max_num_seqs),
        "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
        "--port", str(port),
        "--seed", "0",
    ]
    if spec.attention_backend:
        cmd += ["--attention-backend", spec.attention_backend]
    if spec.speculative_config:
        cmd += ["--speculative-config", json.dumps(spec.speculative_config)]
    if spec.kv_transfer_config:
        cmd += ["--kv-transfer-config", json.dumps(spec.kv_transfer_config)]
    if spec.async_scheduling is False:
        cmd += ["--no-async-scheduling"]
    if spec.max_model_len is not None:
        cmd += ["--max-model-len", str(spec.max_model_len)]
    if spec.executor is not None:
        cmd += ["--distributed-executor-backend", spec.executor]
    if spec.api_servers != 1:
        cmd += ["--api-server-count", str(spec.api_servers)]
    return cmd + mode_cli_args(spec) + list(extra_args)


def serve_and_call(
    spec: RunSpec,
    model_dir: str,
    log_path: Path,
    call: Callable[[str], Awaitable[dict[str, Any]]],
    port: int = 8000,
    startup_timeout_s: float = 600,
    shutdown_timeout_s: float = 60,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Serve ``spec`` on ``port``, run ``call(base_url)`` once it is healthy, stop it.

    The report holds what ``call`` returned, or ``error`` when the server never
    became healthy, and always ``shutdown_rc`` / ``shutdown_clean``.
    """
    report: dict[str, Any] = {"spec": spec_record(spec), "serve": True}
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            serve_command(spec, model_dir, port, extra_args),
            env={**engine_env(spec),
                 "VLLM_PP_CUDAGRAPH_METRICS_DIR": str(records_dir(log_path))},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            healthy = asyncio.run(
                wait_until_healthy(base_url, startup_timeout_s, lambda: proc.poll() is None)
            )
            if not healthy:
                rc = proc.poll()
                report["error"] = (
                    f"server not healthy within {startup_timeout_s} s"
                    if rc is None
                    else f"server exited with rc={rc} before answering /health; see {log_path.name}"
                )
                return report
            report.update(asyncio.run(call(base_url)))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    report["shutdown_rc"] = proc.wait(timeout=shutdown_timeout_s)
                except subprocess.TimeoutExpired:
                    report["shutdown_rc"] = None
                    stop_process_group(proc)
            report["shutdown_clean"] = report.get("shutdown_rc") == 0
    return report


def run_serve_mode(
    spec: RunSpec,
    model_dir: str,
    load: LoadSpec,
    log_path: Path,
    port: int = 8000,
    startup_timeout_s: float = 600,
    shutdown_timeout_s: float = 60,
    extra_args: Sequence[str] = (),
    keep_texts: bool = False,
    watch: Any = None,
) -> dict[str, Any]:
    """Serve ``spec`` on ``port``, send ``load`` (its base_url is set here), stop.

    ``extra_args`` go to ``vllm serve`` as they are. The report holds the load
    summary, a digest of completed texts, and with ``keep_texts`` the
    :class:`~vllm_pp_cudagraph.commands.bench.serve_load.LoadReport` itself (key ``load_report``).
    A ``watch`` is started as the load starts and finished once it ends
    (``watch.start()``, ``watch.finish(base_url)``); what it returns is kept as ``watch``.
    """
    load.model = "dummy"

    async def send_load(base_url: str) -> dict[str, Any]:
        load.base_url = base_url
        if watch is not None:
            watch.start()
        result = await run_load(load)
        summary = result.summary()
        report: dict[str, Any] = {"load": summary}
        for key in ("req_per_s", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms"):
            report[key] = summary[key]
        report["preemptions"] = await fetch_preemptions(base_url)
        report["digest"] = output_digest(completed_texts(result))
        if keep_texts:
            report["load_report"] = result
        if watch is not None:
            report["watch"] = await asyncio.to_thread(watch.finish, base_url)
        return report

    return serve_and_call(spec, model_dir, log_path, send_load, port, startup_timeout_s,
                          shutdown_timeout_s, extra_args)


#: What the ``serve`` workload keeps of each ``vllm bench serve`` result.
VLLM_BENCH_KEYS = {
    "req_per_s": "request_throughput",
    "output_tok_per_s": "output_throughput",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p99_ms": "p99_tpot_ms",
    "itl_p50_ms": "median_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
}


def vllm_bench_serve_command(base_url: str, model_dir: str, concurrency: int, num_prompts: int,
                             input_len: int, output_len: int, result_dir: Path,
                             result_name: str, request_rate: float | None = None,
                             seed: int = 0) -> list[str]:
    """vLLM's own serving client: random dataset, p50/p99 metrics; a closed loop of
    ``concurrency`` requests, or Poisson arrivals at ``request_rate`` with at most
    ``concurrency`` in flight. ``seed`` draws the prompts (:func:`pass_seed`)."""
    arrivals = [] if request_rate is None else ["--request-rate", str(request_rate)]
    return [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "openai", "--base-url", base_url, "--model", "dummy",
        "--tokenizer", model_dir, "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), *arrivals,
        "--ignore-eos", "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", result_name,
    ]


def pass_seed(name: str) -> int:
    """The prompts' seed of the pass named ``name``: the same for every runner, so each
    serves the same prompts, and another for each pass of one server, so that no pass
    finds its prompts in the prefix cache an earlier one filled (vLLM caches prefixes by
    default, and with one seed a second pass would skip most of its prefill)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def vllm_bench_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The ``serve`` workload's columns from one ``vllm bench serve`` result file."""
    summary = {ours: result.get(theirs) for ours, theirs in VLLM_BENCH_KEYS.items()}
    summary["completed"] = result.get("completed")
    summary["failed"] = result.get("failed", 0)
    return summary


TRACE_GLOB = "*.pt.trace.json*"


def collect_traces(profile_dir: Path, dest: Path, expected: int, timeout_s: float = 600,
                   poll_s: float = 2.0) -> int:
    """Move the traces the workers write into ``profile_dir`` to ``dest``; how many.

    Waits until ``expected`` traces are there and their sizes hold still between
    two looks (workers write them as profiling stops), at most ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    sizes: dict[Path, int] | None = None
    while True:
        now = {p: p.stat().st_size for p in profile_dir.glob(TRACE_GLOB) if p.is_file()}
        if (len(now) >= expected and now == sizes) or time.monotonic() > deadline:
            break
        sizes = now
        time.sleep(poll_s)
    dest.mkdir(parents=True, exist_ok=True)
    for path in now:
        shutil.move(str(path), str(dest / path.name))
    return len(now)


async def _post(url: str, timeout_s: float = 900) -> int:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(url) as resp:
            return resp.status


#: A sweep point: a concurrency at the run's input length, or (input length, concurrency).
SweepPoint = int | tuple[int, int]


def stages_over(before: dict[int, StageSnapshot],
                after: dict[int, StageSnapshot]) -> dict[str, list[float] | None]:
    """Each stage's mean step time (ms) and busy share between two readings of its
    snapshots, by stage; None where a stage timed no step in between. The snapshots are
    written every few seconds, so the span is a pass's to within that."""
    def totals(snap: StageSnapshot | None) -> tuple[float, float, float]:
        return (snap.timed_steps_total, snap.busy_ms_total, snap.idle_ms_total) if snap \
            else (0, 0.0, 0.0)

    step_ms, busy = [], []
    for stage, end in sorted(after.items()):
        steps, busy_ms, idle_ms = (e - s for e, s in zip(totals(end), totals(before.get(stage))))
        if steps <= 0:
            return {"stage_step_ms": None, "stage_busy": None}
        step_ms.append(round(busy_ms / steps, 2))
        busy.append(round(busy_ms / (busy_ms + idle_ms), 3) if busy_ms + idle_ms else 1.0)
    return {"stage_step_ms": step_ms or None, "stage_busy": busy or None}


def point_shape(point: SweepPoint, input_len: int) -> tuple[int, int]:
    """``point`` as (input length, concurrency)."""
    return (input_len, point) if isinstance(point, int) else point


@dataclass
class BenchServeClient:
    """``vllm bench serve`` passes against one server, their result files in ``result_dir``;
    with ``profile_dir``, one more pass per point under vLLM's profiler. A timed pass
    sends ``num_prompts`` requests, or two per request in flight where that is more."""

    spec: RunSpec
    model_dir: str
    result_dir: Path
    num_prompts: int
    profile_dir: Path | None = None
    #: Where the server's stages write their snapshots (each pass's step times come from them).
    records: Path | None = None

    def stage_snapshots(self) -> dict[int, StageSnapshot]:
        if self.records is None:
            return {}
        return read_stage_snapshots(0, self.records, max_age_s=math.inf)

    async def one_pass(self, base_url: str, concurrency: int, prompts: int,
                       name: str, input_len: int | None = None) -> dict[str, Any]:
        """One client run of ``prompts`` requests; its summary (``client_rc`` always)."""
        input_len = input_len or self.spec.input_len
        result = self.result_dir / f"{name}.json"
        cmd = vllm_bench_serve_command(base_url, self.model_dir, concurrency, prompts,
                                       input_len, self.spec.output_len,
                                       self.result_dir, result.name, self.spec.request_rate,
                                       seed=pass_seed(name))
        started, stages_before = time.time(), self.stage_snapshots()
        with open(self.result_dir / f"{name}.log", "w") as client_log:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=client_log, stderr=subprocess.STDOUT)
            rc = await proc.wait()
        point: dict[str, Any] = {"concurrency": concurrency, "input_len": input_len,
                                 "client_rc": rc, "started": round(started, 1),
                                 "ended": round(time.time(), 1),
                                 **stages_over(stages_before, self.stage_snapshots())}
        if rc == 0 and result.exists():
            point.update(vllm_bench_summary(json.loads(result.read_text())))
        return point

    async def profiled_pass(self, base_url: str, concurrency: int, input_len: int,
                            name: str) -> dict[str, Any]:
        """One pass of at least ``concurrency`` requests under the profiler; its summary."""
        assert self.profile_dir is not None
        if (status := await _post(f"{base_url}/start_profile")) != 200:
            return {"profile_error": f"/start_profile answered HTTP {status}"}
        await self.one_pass(base_url, concurrency, max(self.num_prompts // 4, concurrency),
                            f"{name}-profiled", input_len)
        if (status := await _post(f"{base_url}/stop_profile")) != 200:
            return {"profile_error": f"/stop_profile answered HTTP {status}"}
        dest = self.profile_dir / name
        ranks = self.spec.pp * self.spec.tp
        found = await asyncio.to_thread(collect_traces, self.profile_dir, dest, ranks)
        if found < ranks:
            return {"profile_error": f"{found} of {ranks} ranks wrote a trace"}
        profile = await asyncio.to_thread(analyze_dir, dest)
        return {"profile": profile, "gpu_busy_pct": stage_busy(profile)}

    async def point(self, base_url: str, point: SweepPoint) -> dict[str, Any]:
        """An untimed warm-up pass, then ``spec.repeat`` passes (at least one) at
        ``point``: the median one, with every pass's req/s and TPOT p50 / p99, and the
        profiled pass's summary."""
        input_len, concurrency = point_shape(point, self.spec.input_len)
        name = f"c{concurrency}" if isinstance(point, int) else f"in{input_len}-c{concurrency}"
        prompts = max(self.num_prompts, 2 * concurrency)
        waited = {}
        if lanes.current is not None:
            waited["lane_wait_s"] = await asyncio.to_thread(lanes.current.meet, name)
        await self.one_pass(base_url, concurrency, self.warmup_prompts(concurrency),
                            f"{name}-warmup", input_len)
        passes = [await self.one_pass(base_url, concurrency, prompts, f"{name}-{i}", input_len)
                  for i in range(max(self.spec.repeat, 1))]
        done = [p for p in passes if p.get("req_per_s")]
        result = dict(median_run(done, key="req_per_s")) if done else passes[-1]
        for key in ("req_per_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "started",
                    "ended", "stage_step_ms", "stage_busy"):
            result[f"pass_{key}"] = [p.get(key) for p in passes]
        result["requests_per_pass"] = prompts
        result.update(waited)
        if self.profile_dir is not None:
            result.update(await self.profiled_pass(base_url, concurrency, input_len, name))
        return result

    def warmup_prompts(self, concurrency: int) -> int:
        """Requests of the untimed pass before a point's: at least one per request in
        flight, so the batch sizes the point reaches run (and compile) first."""
        return max(self.num_prompts // 4, concurrency)

    async def sweep(self, base_url: str, points: Sequence[SweepPoint]) -> dict[str, Any]:
        """Each point, its warm-up pass first."""
        return {"sweep": [await self.point(base_url, p) for p in points]}


def profiler_args(spec: RunSpec) -> tuple[Path | None, list[str]]:
    """Where the server's profiler writes traces (made here), and its ``vllm serve`` flags."""
    if not spec.profile_dir:
        return None, []
    profile_dir = Path(spec.profile_dir)
    profile_dir.mkdir(parents=True, exist_ok=True)
    return profile_dir, ["--profiler-config", json.dumps(profiler_settings(str(profile_dir)))]


def run_vllm_bench_sweep(
    spec: RunSpec,
    model_dir: str,
    log_path: Path,
    points: Sequence[SweepPoint],
    num_prompts: int,
    port: int = 8000,
    startup_timeout_s: float = 600,
) -> list[dict[str, Any]]:
    """Serve ``spec`` once and drive it with ``vllm bench serve`` at each point: a
    concurrency at ``spec.input_len``, or an (input length, concurrency) pair.

    Each point starts with an untimed warm-up pass at its own concurrency
    (new batch sizes compile and settle on first use), then ``spec.repeat`` timed passes
    (at least one), each of ``num_prompts`` requests or two per request in
    flight where that is more; each point reports the pass of median req/s and every
    pass's req/s and TPOT p50 / p99 (the spread between passes). With
    ``spec.profile_dir``, one more pass per point runs under vLLM's profiler
    (``/start_profile`` ... ``/stop_profile``), its traces go to
    ``profile_dir/c<concurrency>`` (``in<input_len>-c<concurrency>`` for a pair),
    and the point gets their per-rank summary (``profile``, ``gpu_busy_pct``).
    One report per point, each with the
    server's shutdown status and how many stages logged the plugin's runner.
    """
    result_dir = log_path.parent / f"{log_path.stem}-results"
    result_dir.mkdir(parents=True, exist_ok=True)
    if lanes.current is not None:
        lanes.current.next_run()
    profile_dir, extra_args = profiler_args(spec)
    client = BenchServeClient(spec, model_dir, result_dir, num_prompts, profile_dir,
                              records=records_dir_of(log_path))
    report = serve_and_call(spec, model_dir, log_path,
                            lambda base_url: client.sweep(base_url, points), port,
                            startup_timeout_s, extra_args=extra_args)
    report.update(log_findings(log_path.read_text(errors="replace")))
    report.update(record_findings(records_dir_of(log_path)))
    if not report.get("sweep") and lanes.current is not None:
        lanes.current.leave()
    done = report.pop("sweep", []) or [
        dict(zip(("input_len", "concurrency"), point_shape(p, spec.input_len))) for p in points]
    return [{**report, **point, "digest": "n/a" if point.get("req_per_s") else None}
            for point in done]
