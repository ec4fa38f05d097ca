"""How the serving soak judges a server's outputs: against stock's own run-to-run
behaviour, not a fixed number.

* Shares (:func:`soak_verdict`): vLLM is not batch-invariant, so any two runs differ in
  some requests; the plugin may differ from stock in no larger a share than stock's runs
  differ between themselves.
* Token check (:func:`score_greedy`, :func:`greedy_verdict`): a further stock server
  scores every completed output token by token; the plugin's tokens may fall at most
  ``slack`` times as far below the model's top choice as stock's do.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import asdict, dataclass

import aiohttp

from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, completed_texts

from benchmarks.tools.sampling_mix import schema_problems, scored, structured


def differing_share(a: LoadReport, b: LoadReport) -> float:
    """Share of requests completed in both runs whose texts differ; NaN if none was."""
    both = [(x, y) for x, y in zip(completed_texts(a), completed_texts(b))
            if x is not None and y is not None]
    return sum(x != y for x, y in both) / len(both) if both else float("nan")


def divergence_word(a: LoadReport, b: LoadReport) -> float:
    """Median position (in words) of the first difference over requests that differ; NaN
    if none does. Noise flips a token late, a mishandled request differs from its start."""
    in_b = {r.index: r for r in b.results if r.completed}
    positions = []
    for x in a.results:
        y = in_b.get(x.index)
        if not x.completed or y is None or x.text == y.text:
            continue
        wx, wy = (x.text or "").split(), (y.text or "").split()
        positions.append(next((i for i, (u, v) in enumerate(zip(wx, wy)) if u != v),
                              min(len(wx), len(wy))))
    return float(statistics.median(positions)) if positions else float("nan")


def serving_problems(server: dict) -> list[str]:
    """What went wrong serving the load: errors, failed health checks, unclean shutdown."""
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


def structured_problems(report: LoadReport) -> list[str]:
    """Completed structured-output requests whose text is not JSON matching the schema (a
    document cut off by ``max_tokens`` counts; cancelled requests do not)."""
    return [f"request {r.index} ({r.sampling}): {problem}"
            for r in report.results if structured(r.sampling) and r.completed
            for problem in schema_problems(r.text or "")]


def soak_verdict(plugin: dict, plugin_vs_stock: float, stock_vs_stock: float,
                 shares_judge: bool = True) -> list[str]:
    """Why the plugin's server failed the soak ([] if it passed): serving problems, and a
    larger share differing from stock than stock's own. The share rule assumes batches
    form as stock's do; ``shares_judge=False`` (another cadence) leaves it out."""
    problems = serving_problems(plugin)
    if plugin.get("load") is None:
        return problems
    if math.isnan(plugin_vs_stock) or math.isnan(stock_vs_stock):
        problems.append("no request completed in both runs of a comparison")
    elif shares_judge and plugin_vs_stock > stock_vs_stock:
        problems.append(f"{plugin_vs_stock:.1%} of requests differ from stock, more than "
                        f"stock's own {stock_vs_stock:.1%} between its own runs")
    return problems


def greedy_margins(prompt_logprobs: list, token_ids: list[int], start: int) -> list[float]:
    """How far each token from ``start`` on fell below the top choice, in nats (0: the
    model's first choice), from vLLM's ``prompt_logprobs`` of ``token_ids`` scored as a
    prompt with ``prompt_logprobs=1`` (per position: token id string -> ``{"logprob"}``)."""
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
    """Request index -> (prompt + output token ids, where the output starts), for the
    requests whose sampling follows the model's top choice (:func:`scored`)."""
    return {
        r.index: (r.prompt_token_ids + r.token_ids, len(r.prompt_token_ids))
        for r in report.results
        if r.completed and r.prompt_token_ids and r.token_ids and scored(r.sampling)
    }


async def score_greedy(base_url: str, model: str, sequences: dict[int, tuple[list[int], int]],
                       concurrency: int = 64, worst: int = 10) -> GreedyCheck:
    """Feed each sequence back as a prompt and measure its output tokens' margins: noise
    only ever takes a token within rounding of the top one; a lost, repeated or foreign
    token stands out by the model's logit spread."""
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
    """Why the plugin's outputs fail the token check ([] if they pass): stock's own outputs
    show how far below the top choice rounding puts a token; the plugin may go ``slack``
    times as far."""
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


