"""Load for an OpenAI-compatible server, as users send it.

Sends ``num_requests`` greedy completions at a fixed concurrency, a share of
them streamed, a share of the streamed ones cancelled mid-stream (the client
closes the connection, as a user pressing stop does), while a side task polls
``/health``. Records per-request outcome, text, token ids, time to first token and time per
output token. Which requests stream or cancel depends only on the seed, so two
servers can be compared request by request.

It also checks outputs token by token (:func:`score_greedy`): a server scores
each completed sequence, prompt and output fed back as one prompt, and every
output token is measured by how far its log-probability falls below the
server's own top choice at that position.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import aiohttp

from vllm_pp_cudagraph.stats import percentile


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

    def plan(self, index: int) -> tuple[bool, int | None]:
        """(stream?, cancel after this many chunks or None) for request ``index``."""
        rng = random.Random(self.seed * 1_000_003 + index)
        stream = rng.random() < self.stream_fraction
        cancel = stream and rng.random() < self.cancel_fraction / max(self.stream_fraction, 1e-9)
        return stream, (max(1, self.max_tokens // 4) if cancel else None)


@dataclass
class RequestResult:
    """One request's outcome."""

    index: int
    stream: bool
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


def _completed_pairs(a: LoadReport, b: LoadReport) -> list[tuple[RequestResult, RequestResult]]:
    by_index = {r.index: r for r in b.results if r.completed}
    return [(r, by_index[r.index]) for r in a.results if r.completed and r.index in by_index]


def completed_texts(report: LoadReport) -> list[str | None]:
    """Per request index, its text; None where it did not complete."""
    texts: list[str | None] = [None] * (max((r.index for r in report.results), default=-1) + 1)
    for r in report.results:
        if r.completed:
            texts[r.index] = r.text or ""
    return texts


def share_differing(a: Sequence[str | None], b: Sequence[str | None]) -> float:
    """Share of requests completed in both runs whose outputs differ; NaN if none was.

    ``a`` and ``b`` hold one entry per request index (texts or their digests),
    None where the request did not complete.
    """
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return sum(x != y for x, y in both) / len(both) if both else float("nan")


def differing_share(a: LoadReport, b: LoadReport) -> float:
    """Share of requests completed in both runs whose texts differ."""
    return share_differing(completed_texts(a), completed_texts(b))


def text_digests(report: LoadReport) -> list[str | None]:
    """Per request index, a short digest of its text; None where it did not complete.

    Kept with a soak's results, so that any two runs, of one soak or of
    several, can be compared request by request afterwards.
    """
    return [None if text is None else hashlib.sha1(text.encode()).hexdigest()[:12]
            for text in completed_texts(report)]


def divergence_word(a: LoadReport, b: LoadReport) -> float:
    """Median position (in words) of the first difference, over requests that differ.

    Numerical noise between runs flips a token late in a greedy sequence; a
    request handled wrongly (a lost, repeated or foreign token) differs from
    its first words. Comparing this median with stock's own tells the two apart
    where the share of differing requests cannot. NaN when no request differs.
    """
    positions = []
    for x, y in _completed_pairs(a, b):
        if x.text == y.text:
            continue
        wx, wy = (x.text or "").split(), (y.text or "").split()
        positions.append(next((i for i, (u, v) in enumerate(zip(wx, wy)) if u != v),
                              min(len(wx), len(wy))))
    return float(statistics.median(positions)) if positions else float("nan")


def serving_problems(server: dict) -> list[str]:
    """What went wrong serving the load: errors, failed health checks, unclean shutdown.

    ``server`` is one server's report (``load`` summary, ``shutdown_clean``).
    """
    summary = server.get("load")
    if summary is None:
        return [server.get("error") or "no load report"]
    problems = []
    if summary["errors"]:
        problems.append(f"{summary['errors']} request errors")
    if summary["health_failures"]:
        problems.append(f"{summary['health_failures']} failed health checks")
    if not server.get("shutdown_clean"):
        problems.append(f"unclean shutdown (rc={server.get('shutdown_rc')})")
    return problems


def soak_verdict(plugin: dict, plugin_vs_stock: float, stock_vs_stock: float,
                 batch_invariant: bool = False) -> list[str]:
    """Why a soak of the plugin failed; an empty list means it passed.

    ``plugin`` is the plugin server's report (``load`` summary, ``shutdown_clean``).
    The plugin may differ from stock in no larger a share of requests than stock
    differs from itself between two runs (each share a mean where there are
    several runs to pair). Under vLLM's batch-invariant mode that share should
    be zero, and then the plugin must match stock exactly. Under PP (0.26,
    TRITON_ATTN) two stock runs still differ in that mode; the plugin is then
    held to stock's own share, as without it.
    """
    problems = serving_problems(plugin)
    if plugin.get("load") is None:
        return problems
    if math.isnan(plugin_vs_stock) or math.isnan(stock_vs_stock):
        problems.append("no request completed in both runs of a comparison")
    elif batch_invariant and stock_vs_stock == 0 and plugin_vs_stock > 0:
        problems.append(
            f"{plugin_vs_stock:.1%} of requests differ from stock under batch invariance, "
            "where two stock runs agree on every request"
        )
    elif plugin_vs_stock > stock_vs_stock:
        problems.append(
            f"{plugin_vs_stock:.1%} of requests differ from stock, more than stock's own "
            f"{stock_vs_stock:.1%} between its own runs"
        )
    return problems


def greedy_margins(prompt_logprobs: list, token_ids: list[int], start: int) -> list[float]:
    """How far each token from ``start`` on fell below the top choice, in nats.

    ``prompt_logprobs`` is vLLM's completion field for ``token_ids`` scored as a
    prompt with ``prompt_logprobs=1``: per position a mapping from token id (a
    string in JSON) to ``{"logprob": ...}``, holding that position's token and
    the most likely one. 0 means the token was the model's first choice.
    """
    margins = []
    for position in range(start, len(token_ids)):
        entry = prompt_logprobs[position]
        actual = entry[str(token_ids[position])]["logprob"]
        margins.append(max(v["logprob"] for v in entry.values()) - actual)
    return margins


@dataclass
class GreedyCheck:
    """Token-by-token check of one server's greedy outputs, scored by another."""

    requests: int
    positions: int
    not_first_choice: int
    max_margin: float
    #: (request index, output position, margin) of the largest margins
    worst: list[tuple[int, int, float]]
    errors: list[str]

    def summary(self) -> dict:
        return asdict(self)


def completed_sequences(report: LoadReport) -> dict[int, tuple[list[int], int]]:
    """Request index -> (prompt + output token ids, where the output starts)."""
    return {
        r.index: (r.prompt_token_ids + r.token_ids, len(r.prompt_token_ids))
        for r in report.results
        if r.completed and r.prompt_token_ids and r.token_ids
    }


async def score_greedy(base_url: str, model: str, sequences: dict[int, tuple[list[int], int]],
                       concurrency: int = 64, worst: int = 10) -> GreedyCheck:
    """Feed each sequence back as a prompt and measure its output tokens' margins.

    Under numerical noise a greedy output only ever takes a token whose
    log-probability is within rounding of the top one; a lost, repeated or
    foreign token stands out by the logit spread of the model.
    """
    gate = asyncio.Semaphore(concurrency)
    errors: list[str] = []
    found: list[tuple[int, int, float]] = []
    positions = 0

    async def one(session: aiohttp.ClientSession, index: int, ids: list[int], start: int) -> None:
        nonlocal positions
        body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1}
        async with gate:
            try:
                async with session.post(f"{base_url}/v1/completions", json=body) as resp:
                    if resp.status != 200:
                        errors.append(f"request {index}: HTTP {resp.status}: {(await resp.text())[:200]}")
                        return
                    payload = await resp.json()
                margins = greedy_margins(payload["choices"][0]["prompt_logprobs"], ids, start)
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, TypeError, ValueError) as exc:
                errors.append(f"request {index}: {type(exc).__name__}: {exc}")
                return
        positions += len(margins)
        found.extend((index, i, m) for i, m in enumerate(margins) if m > 0)

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session, i, ids, start) for i, (ids, start) in sequences.items()))
    found.sort(key=lambda f: -f[2])
    return GreedyCheck(len(sequences), positions, len(found),
                       found[0][2] if found else 0.0, found[:worst], errors[:10])


def greedy_verdict(plugin: GreedyCheck, stock: GreedyCheck, slack: float = 2.0) -> list[str]:
    """Why the plugin's outputs fail the token check against stock's own; [] if they pass.

    Both servers' outputs are scored by a third (stock) server. Stock's own
    outputs show how far below the top choice rounding alone puts a served
    token; the plugin may go ``slack`` times as far, no further.
    """
    problems = [f"{name}: {len(c.errors)}+ scoring errors, first: {c.errors[0]}"
                for name, c in (("plugin", plugin), ("stock", stock)) if c.errors]
    if not plugin.positions or not stock.positions:
        problems.append("no output tokens were scored")
    elif plugin.max_margin > slack * stock.max_margin + 1e-3:
        problems.append(
            f"a plugin output token lies {plugin.max_margin:.3f} nats below the top choice "
            f"(request, position: {plugin.worst[0][:2]}); stock's own outputs reach "
            f"{stock.max_margin:.3f}")
    return problems


async def _one(session: aiohttp.ClientSession, spec: LoadSpec, index: int) -> RequestResult:
    stream, cancel_after = spec.plan(index)
    result = RequestResult(index=index, stream=stream)
    body = {
        "model": spec.model,
        "prompt": spec.prompts[index % len(spec.prompts)],
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
        "return_token_ids": True,
    }
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
