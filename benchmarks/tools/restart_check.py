"""Start-up as an operator restarting a server sees it: each runner started on fresh
caches (cold), then again on the same caches (warm), one ``vllm serve`` at a time.

Per start: seconds to ``/health``, vLLM's init and torch.compile seconds, graphs loaded
from the cache, the compile-cache folders, the first sampled request's latency. Run
``--order`` both ways round to see order effects.

    python -m benchmarks.tools.restart_check --out DIR [--order plugin,stock] [--pp 2]
        [--starts cold,warm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, engine_env, stop_process_group
from vllm_pp_cudagraph.commands.bench.serve_load import wait_until_healthy
from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_INIT_COMPILATION = re.compile(r"warmup model\) took [\d.]+ s \(compilation: ([\d.]+) s")
_COMPILE = re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total")
_COMPILED = re.compile(r"Compiling a graph for compile range .* takes ([\d.]+) s")


def cache_folders(cache_root: Path) -> list[str]:
    """The compile-cache folders under ``VLLM_CACHE_ROOT`` (one per cache key)."""
    root = cache_root / "torch_compile_cache"
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


async def first_sampled_request(base_url: str) -> float:
    body = {"model": "dummy", "prompt": "w5 w6 w7", "max_tokens": 16, "temperature": 0.8,
            "top_p": 0.9, "ignore_eos": True}
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            await response.read()
            response.raise_for_status()
    return round(time.monotonic() - started, 3)


def one_start(runner: str, caches: Path, model_dir: Path, log_path: Path,
              args: argparse.Namespace) -> dict[str, Any]:
    """Serve ``runner`` on the compile caches under ``caches``: what its start-up took."""
    spec = RunSpec(runner, "full_and_piecewise", pp=args.pp, tp=args.tp, max_num_seqs=64,
                   weights="dummy", gpu_memory_utilization=0.6, max_model_len=2048)
    env = engine_env(spec)
    env.update({"VLLM_CACHE_ROOT": str(caches / "vllm"),
                "TRITON_CACHE_DIR": str(caches / "triton")})
    before = cache_folders(caches / "vllm")
    base_url = f"http://127.0.0.1:{args.port}"
    report: dict[str, Any] = {"runner": runner, "cache": "warm" if before else "cold",
                              "cache_folders_before": before}
    with open(log_path, "w") as log_file:
        started = time.monotonic()
        proc = subprocess.Popen(serve_command(spec, str(model_dir), args.port), env=env,
                                stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            healthy = asyncio.run(wait_until_healthy(base_url, 900, lambda: proc.poll() is None))
            report["health_s"] = round(time.monotonic() - started, 1) if healthy else None
            if healthy:
                report["first_sampled_request_s"] = asyncio.run(first_sampled_request(base_url))
        finally:
            try:
                os.killpg(proc.pid, signal.SIGINT)
                proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                stop_process_group(proc)
    log = log_path.read_text(errors="replace")
    init, compilation = _INIT.search(log), _INIT_COMPILATION.search(log)
    report["init_engine_s"] = float(init.group(1)) if init else None
    report["init_compilation_s"] = float(compilation.group(1)) if compilation else 0.0
    report["torch_compile_s"] = [float(s) for s in _COMPILE.findall(log)]
    report["graphs_loaded_from_cache"] = log.count("Directly load the compiled graph")
    report["graphs_compiled"] = len(_COMPILED.findall(log))
    report["plugin_lines"] = log.count("vllm-pp-cudagraph active on all")
    report["cache_folders_after"] = cache_folders(caches / "vllm")
    report["new_cache_folders"] = sorted(set(report["cache_folders_after"]) - set(before))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--order", default="plugin,stock", help="runners, in order")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--starts", default="cold,warm", choices=("cold,warm", "cold"),
                        help="per runner: a cold start then a warm one, or the cold one alone")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = write_model_dir(tempfile.mkdtemp(prefix="restart-"), tokenizer=True)
    reports = []
    for runner in args.order.split(","):
        caches = Path(tempfile.mkdtemp(prefix=f"restart-caches-{runner}-"))
        for start in args.starts.split(","):
            report = one_start(runner, caches, model_dir, out / f"{runner}-{start}.log", args)
            reports.append(report)
            print(json.dumps(report), flush=True)
            (out / "restarts.json").write_text(json.dumps(reports, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
