"""Load for an OpenAI-compatible server, as users send it.

Sends ``num_requests`` completions at a fixed concurrency, greedy or, with
``sampling_mix``, each with one of its named sampling options; a share of them
streamed, a share of the streamed ones cancelled mid-stream (the client closes
the connection, as a user pressing stop does), while a side task polls
``/health``. Records per-request outcome, text, token ids, time to first token
and time per output token. Which requests stream, cancel or sample how depends
only on the seed, so two servers can be compared request by request.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vllm_pp_cudagraph.commands.bench.stats import percentile


@dataclass
class LoadSpec:
    """What load to send, where."""

    base_url: str
    model: str
    prompts: list[str]
    num_requests: int
    concurrency: int
    max_tokens: int
    stream_fraction: float = 0.5
    cancel_fraction: float = 0.1
    seed: int = 0
    health_interval_s: float = 1.0
    request_timeout_s: float = 600.0
    sampling_mix: dict[str, dict[str, Any]] | None = None
    """Named sampling options, one per request (chosen by its seed); None: greedy."""

    def plan(self, index: int) -> tuple[bool, int | None, str]:
        """(stream?, cancel after this many chunks or None, sampling) for request ``index``.

        ``n > 1`` is only sent unstreamed: the load reads one choice per chunk.
        """
        rng = random.Random(self.seed * 1_000_003 + index)
        stream = rng.random() < self.stream_fraction
        cancel = stream and rng.random() < self.cancel_fraction / max(self.stream_fraction, 1e-9)
        sampling = "greedy"
        if self.sampling_mix:
            sampling = rng.choice([name for name, options in self.sampling_mix.items()
                                   if not (stream and options.get("n", 1) > 1)])
        return stream, (max(1, self.max_tokens // 4) if cancel else None), sampling


@dataclass
class RequestResult:
    """One request's outcome."""

    index: int
    stream: bool
    sampling: str = "greedy"
    cancelled: bool = False
    error: str | None = None
    text: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """Answered in full: neither failed nor cancelled."""
        return self.error is None and not self.cancelled

    @property
    def tpot_s(self) -> float | None:
        if len(self.chunk_times) < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / (len(self.chunk_times) - 1)


@dataclass
class LoadReport:
    """Everything one load run observed."""

    results: list[RequestResult]
    elapsed_s: float
    health_checks: int
    health_failures: list[str]

    def summary(self) -> dict[str, float | int]:
        done = [r for r in self.results if r.completed]
        ttft = [r.ttft_s * 1000 for r in self.results if r.stream and r.ttft_s is not None]
        tpot = [r.tpot_s * 1000 for r in done if r.stream and r.tpot_s is not None]
        return {
            "requests": len(self.results),
            "completed": len(done),
            "cancelled": sum(r.cancelled for r in self.results),
            "errors": sum(r.error is not None for r in self.results),
            "req_per_s": round(len(done) / self.elapsed_s, 2) if self.elapsed_s else 0.0,
            "ttft_mean_ms": round(sum(ttft) / len(ttft), 2) if ttft else float("nan"),
            "ttft_p99_ms": round(percentile(ttft, 99), 2),
            "tpot_mean_ms": round(sum(tpot) / len(tpot), 3) if tpot else float("nan"),
            "tpot_p99_ms": round(percentile(tpot, 99), 3),
            "health_checks": self.health_checks,
            "health_failures": len(self.health_failures),
        }


def completed_texts(report: LoadReport) -> list[str | None]:
    """Per request index, its text; None where it did not complete."""
    texts: list[str | None] = [None] * (max((r.index for r in report.results), default=-1) + 1)
    for r in report.results:
        if r.completed:
            texts[r.index] = r.text or ""
    return texts


def request_body(spec: LoadSpec, index: int, stream: bool, sampling: str) -> dict[str, Any]:
    """The ``/v1/completions`` body of request ``index``."""
    return {
        "model": spec.model,
        "prompt": spec.prompts[index % len(spec.prompts)],
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
        "return_token_ids": True,
        **(spec.sampling_mix or {}).get(sampling, {}),
    }


async def _one(session: aiohttp.ClientSession, spec: LoadSpec, index: int) -> RequestResult:
    stream, cancel_after, sampling = spec.plan(index)
    result = RequestResult(index=index, stream=stream, sampling=sampling)
    body = request_body(spec, index, stream, sampling)
    start = time.perf_counter()
    try:
        async with session.post(f"{spec.base_url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            if not stream:
                payload = await resp.json()
                choice = payload["choices"][0]
                result.text = choice["text"]
                result.prompt_token_ids = choice.get("prompt_token_ids")
                result.token_ids = choice.get("token_ids")
                result.ttft_s = time.perf_counter() - start
                return result
            pieces = []
            token_ids: list[int] = []
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                if result.ttft_s is None:
                    result.ttft_s = now - start
                result.chunk_times.append(now)
                choice = json.loads(data)["choices"][0]
                pieces.append(choice["text"])
                token_ids += choice.get("token_ids") or []
                if choice.get("prompt_token_ids") is not None:
                    result.prompt_token_ids = choice["prompt_token_ids"]
                if cancel_after is not None and len(pieces) >= cancel_after:
                    result.cancelled = True
                    resp.close()  # drop the connection: the server must abort the request
                    break
            result.text = "".join(pieces)
            result.token_ids = token_ids
    except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    return result


async def _watch_health(
    session: aiohttp.ClientSession, spec: LoadSpec, stop: asyncio.Event, failures: list[str]
) -> int:
    checks = 0
    while not stop.is_set():
        checks += 1
        try:
            timeout = aiohttp.ClientTimeout(total=10)
            async with session.get(f"{spec.base_url}/health", timeout=timeout) as resp:
                if resp.status != 200:
                    failures.append(f"HTTP {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            failures.append(f"{type(exc).__name__}: {exc}")
        try:
            await asyncio.wait_for(stop.wait(), spec.health_interval_s)
        except asyncio.TimeoutError:
            pass
    return checks


async def run_load(spec: LoadSpec) -> LoadReport:
    """Send the load described by ``spec``; return what was observed."""
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.concurrency + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        stop = asyncio.Event()
        failures: list[str] = []
        health = asyncio.create_task(_watch_health(session, spec, stop, failures))
        gate = asyncio.Semaphore(spec.concurrency)

        async def bounded(index: int) -> RequestResult:
            async with gate:
                return await _one(session, spec, index)

        start = time.perf_counter()
        results = await asyncio.gather(*(bounded(i) for i in range(spec.num_requests)))
        elapsed = time.perf_counter() - start
        stop.set()
        checks = await health
    return LoadReport(list(results), elapsed, checks, failures)


async def wait_until_healthy(base_url: str, timeout_s: float, alive=lambda: True) -> bool:
    """Poll ``/health`` until it answers 200, the deadline passes, or ``alive()`` is False."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline and alive():
            try:
                async with session.get(f"{base_url}/health") as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(1.0)
    return False


def preemptions_from_metrics(text: str) -> int | None:
    """The engine's preemption count from ``/metrics`` text; None when absent."""
    values = [
        float(line.rsplit(None, 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_preemptions_total")
    ]
    return int(sum(values)) if values else None


async def fetch_preemptions(base_url: str) -> int | None:
    """How many requests the server has preempted so far (None if it does not say)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        try:
            async with session.get(f"{base_url}/metrics") as resp:
                return preemptions_from_metrics(await resp.text()) if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
