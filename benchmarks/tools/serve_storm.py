"""A storm of aborted and bad requests against one server beside good traffic: passes where
bad requests get a 4xx, good ones not dropped complete, and the server serves on after."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.tools.soak_watch import requests_in_server
from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, record_findings, records_dir_of
from vllm_pp_cudagraph.commands.bench.serve_run import serve_and_call

MAX_MODEL_LEN = 512
COMPLETIONS = "/v1/completions"

#: Requests the server must turn away with a 4xx: a body (``model`` added where absent) or bytes.
BAD_REQUESTS: dict[str, dict[str, Any] | bytes] = {
    "prompt over --max-model-len": {"prompt": "w5 " * (MAX_MODEL_LEN + 64), "max_tokens": 8},
    "negative max_tokens": {"prompt": "w5 w6", "max_tokens": -1},
    "unknown model": {"model": "no-such-model", "prompt": "w5 w6", "max_tokens": 4},
    "temperature below zero": {"prompt": "w5 w6", "max_tokens": 4, "temperature": -1.0},
    "top_p above one": {"prompt": "w5 w6", "max_tokens": 4, "top_p": 1.5},
    "n of zero": {"prompt": "w5 w6", "max_tokens": 4, "n": 0},
    "logprobs above the server's limit": {"prompt": "w5 w6", "max_tokens": 4, "logprobs": 10_000},
    "malformed JSON body": b'{"model": "dummy", "prompt": "w5 w6", "max_tokens": ',
}

#: How a good request ends: read to the end, closed after its first chunk, or given up on.
GOOD_ENDINGS = ("complete", "stop_after_first_chunk", "client_timeout")


class StormTally:
    """What the storm's clients saw."""

    def __init__(self) -> None:
        self.good: Counter[str] = Counter()
        self.good_failures: list[str] = []  # good requests failed though the client kept them
        self.bad: dict[str, Counter[str]] = {kind: Counter() for kind in BAD_REQUESTS}

    def report(self) -> dict[str, Any]:
        return {"good": dict(self.good), "good_failures": self.good_failures[:20],
                "good_failed": len(self.good_failures),
                "bad": {kind: dict(codes) for kind, codes in self.bad.items()}}


async def storm(base_url: str, model: str, seconds: float, streams: int) -> StormTally:
    """``streams`` good clients and half as many bad ones, each sending back to back."""
    tally = StormTally()
    deadline = time.monotonic() + seconds
    rng = random.Random(0)
    kinds = list(BAD_REQUESTS)
    url = base_url + COMPLETIONS

    async def good_client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            ending = rng.choice(GOOD_ENDINGS)
            body = {"model": model, "prompt": "w5 w6 w7 w8", "max_tokens": 64,
                    "ignore_eos": True, "stream": ending != "complete"}
            timeout = aiohttp.ClientTimeout(total=0.05 if ending == "client_timeout" else 300)
            try:
                async with session.post(url, json=body, timeout=timeout) as resp:
                    if resp.status != 200:
                        tally.good_failures.append(f"{ending}: HTTP {resp.status}")
                        continue
                    if ending == "stop_after_first_chunk":
                        await resp.content.readline()  # leaving the block closes the stream
                    else:
                        await resp.read()
                    tally.good[ending] += 1
            except asyncio.TimeoutError:
                if ending == "client_timeout":
                    tally.good[ending] += 1
                else:
                    tally.good_failures.append(f"{ending}: timed out")
            except aiohttp.ClientError as e:
                tally.good_failures.append(f"{ending}: {type(e).__name__}")

    async def bad_client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            kind = rng.choice(kinds)
            request = BAD_REQUESTS[kind]
            send = ({"data": request, "headers": {"Content-Type": "application/json"}}
                    if isinstance(request, bytes) else {"json": {"model": model, **request}})
            try:
                async with session.post(url, timeout=aiohttp.ClientTimeout(total=60),
                                        **send) as resp:
                    await resp.read()
                    tally.bad[kind][str(resp.status)] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                tally.bad[kind][type(e).__name__] += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(good_client(session) for _ in range(streams)),
                             *(bad_client(session) for _ in range(max(1, streams // 2))))
    return tally


async def after_storm(base_url: str, model: str, settle_s: float = 5.0) -> dict[str, Any]:
    """Whether the server still serves once the storm is over, and what it still holds."""
    await asyncio.sleep(settle_s)
    found: dict[str, Any] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        try:
            async with session.get(base_url + "/health") as resp:
                found["healthy_after"] = resp.status == 200
            body = {"model": model, "prompt": "w5 w6", "max_tokens": 8}
            async with session.post(base_url + COMPLETIONS, json=body) as resp:
                found["serves_after"] = resp.status == 200
            async with session.get(base_url + "/metrics") as resp:
                found["requests_left"] = requests_in_server(await resp.text())
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            found["after_error"] = f"{type(e).__name__}: {e}"
    return found


def problems(report: dict[str, Any]) -> list[str]:
    """What the storm's report says went wrong; empty where it passed."""
    found = [f"{kind}: answered {codes}, not a 4xx" for kind, codes in report["bad"].items()
             if any(not code.startswith("4") for code in codes)]
    found += [f"{kind}: never sent" for kind, codes in report["bad"].items() if not codes]
    if report["good_failed"]:
        found.append(f"{report['good_failed']} good requests failed: "
                     f"{', '.join(report['good_failures'][:5])}")
    if not report["good"].get("complete"):
        found.append("no good request completed")
    for key, wanted in (("healthy_after", True), ("serves_after", True), ("requests_left", 0)):
        if report.get(key) != wanted:
            found.append(f"after the storm {key} = {report.get(key)!r}, not {wanted!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="directory for the report and log")
    parser.add_argument("--runner", default="plugin", help="plugin, stock, ... (engine_run.RUNNERS)")
    parser.add_argument("--pp", type=int, default=2, help="pipeline-parallel size")
    parser.add_argument("--gpus", default="", help="CUDA_VISIBLE_DEVICES for the server")
    parser.add_argument("--port", type=int, default=8600)
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    model_dir = str(write_model_dir(tempfile.mkdtemp(prefix="storm-"), tokenizer=True))
    spec = RunSpec(args.runner, "full_and_piecewise", pp=args.pp, max_num_seqs=64,
                   weights="dummy", gpu_memory_utilization=0.4,
                   extra_env={"CUDA_VISIBLE_DEVICES": args.gpus} if args.gpus else {})
    log_path = Path(args.out) / f"storm-{args.runner}-pp{args.pp}.log"

    async def call(base_url: str) -> dict[str, Any]:
        tally = await storm(base_url, "dummy", seconds=60.0, streams=32)
        return {**tally.report(), **await after_storm(base_url, "dummy")}

    report = serve_and_call(spec, model_dir, log_path, call, port=args.port,
                            extra_args=["--max-model-len", str(MAX_MODEL_LEN)])
    report["runner"], report["pp"] = args.runner, args.pp
    report["plugin_stages"] = record_findings(records_dir_of(log_path))["plugin_stages"]
    if "error" in report:
        report["problems"] = ["server: " + report["error"]]
    else:
        report["problems"] = problems(report) + (
            [] if report.get("shutdown_clean") else ["the server did not shut down cleanly"])
    report["passed"] = not report["problems"]
    (Path(args.out) / f"storm-{args.runner}-pp{args.pp}.json").write_text(
        json.dumps(report, indent=2, default=str))
    print(json.dumps({k: report.get(k) for k in ("runner", "passed", "problems", "good",
                                                 "requests_left", "plugin_stages")},
                     default=str))
    return 0 if report["passed"] or args.runner != "plugin" else 1


if __name__ == "__main__":
    raise SystemExit(main())
