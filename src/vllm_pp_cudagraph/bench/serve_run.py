"""Run one runner / graph mode behind ``vllm serve`` and load it.

Starts ``vllm serve`` on a built-in model shape with a generated tokenizer in its
own process group (log streamed to a file), waits for ``/health``, sends the
load (:mod:`vllm_pp_cudagraph.bench.serve_load`) or any other client call, then stops
the server with SIGINT and records whether it shut down cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.bench.engine_run import MODES, RunSpec, engine_env, stop_process_group
from vllm_pp_cudagraph.bench.serve_load import (
    LoadSpec,
    completed_texts,
    fetch_preemptions,
    run_load,
    wait_until_healthy,
)
from vllm_pp_cudagraph.bench.stats import output_digest


def mode_cli_args(mode: str) -> list[str]:
    """``vllm serve`` flags for a graph mode (the CLI form of its engine kwargs)."""
    args: list[str] = []
    for key, value in MODES[mode][0].items():
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
        "--max-num-seqs", str(spec.max_num_seqs),
        "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
        "--port", str(port),
        "--seed", "0",
    ]
    if spec.attention_backend:
        cmd += ["--attention-backend", spec.attention_backend]
    return cmd + mode_cli_args(spec.mode) + list(extra_args)


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
    report: dict[str, Any] = {"spec": asdict(spec), "serve": True}
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            serve_command(spec, model_dir, port, extra_args),
            env=engine_env(spec),
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
) -> dict[str, Any]:
    """Serve ``spec`` on ``port``, send ``load`` (its base_url is set here), stop.

    ``extra_args`` go to ``vllm serve`` as they are. The report holds the load
    summary, a digest of completed texts, and with ``keep_texts`` the
    :class:`~vllm_pp_cudagraph.bench.serve_load.LoadReport` itself (key ``load_report``).
    """
    load.model = "dummy"

    async def send_load(base_url: str) -> dict[str, Any]:
        load.base_url = base_url
        result = await run_load(load)
        summary = result.summary()
        report: dict[str, Any] = {"load": summary}
        for key in ("req_per_s", "ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_p99_ms"):
            report[key] = summary[key]
        report["preemptions"] = await fetch_preemptions(base_url)
        report["digest"] = output_digest(completed_texts(result))
        if keep_texts:
            report["load_report"] = result
        return report

    return serve_and_call(spec, model_dir, log_path, send_load, port, startup_timeout_s,
                          shutdown_timeout_s, extra_args)
