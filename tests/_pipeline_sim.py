"""A PP pipeline simulated around vLLM's real scheduler, to time each decode cadence on CPU.

vLLM's real ``AsyncScheduler`` (``_scheduler.py``) schedules every step, with the plugin's
cadence where one is asked for; :class:`PipelineClock` times each step on ``pp_size``
simulated stages whose forward costs come from a cost profile (a model one, or a recorded
stage profile: ``benchmarks/tools/stage_cost.py``'s ``stage_cost.json``). ``auto``'s
chooser measures on that clock. :func:`serve_passes` drives the scheduler as
``vllm bench serve`` drives a server: closed-loop passes at a fixed concurrency, or
Poisson arrivals at a request rate with the concurrency as a cap, each pass drained
before the next. The figures are the model's, for comparing cadences on the same steps.
"""

from __future__ import annotations

import functools
import json
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _scheduler import BLOCK, make_scheduler
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from vllm_pp_cudagraph.engine_core import decode_cadence
from vllm_pp_cudagraph.engine_core.cadence_policy import CadenceChooser
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings


class PipelineClock:
    """Simulated time of a ``pp_size``-stage pipeline serving the scheduler's steps.

    A step's first stage starts once the engine has sent it (``host_ms`` after
    the previous step), the stage is free, and every request in it has its
    previous token back from the last stage; each stage then takes
    ``forward_ms(tokens)``. As in the engine core, up to ``pp_size + 1`` steps are
    in flight: the next step is scheduled once the oldest one is out.
    Calling the clock gives the time of the ``schedule()`` call in progress.
    """

    def __init__(self, pp_size: int, host_ms, forward_ms):
        self.pp_size = pp_size
        # A constant, or a function of the step's tokens as forward_ms is.
        self.host_ms = host_ms if callable(host_ms) else (lambda tokens: host_ms)
        self.forward_ms = forward_ms
        self.now_ms = 0.0
        self.stage_free = [0.0] * pp_size
        self.token_ready: dict[str, float] = {}
        self.in_flight: deque[float] = deque()

    def __call__(self) -> float:
        return self.now_ms / 1000

    def run(self, output) -> None:
        tokens = sum(output.num_scheduled_tokens.values())
        host_ms = self.host_ms(tokens)
        t = max([self.now_ms + host_ms]
                + [self.token_ready.get(r, 0.0) for r in output.num_scheduled_tokens])
        if tokens:
            for stage in range(self.pp_size):
                t = max(t, self.stage_free[stage]) + self.forward_ms(tokens)
                self.stage_free[stage] = t
        for req_id in output.num_scheduled_tokens:
            self.token_ready[req_id] = t
        self.in_flight.append(t)
        self.now_ms += host_ms
        if len(self.in_flight) > self.pp_size:
            self.now_ms = max(self.now_ms, self.in_flight.popleft())

    @property
    def end_ms(self) -> float:
        return max([self.now_ms, *self.in_flight])


def recorded_profile(path: Path, shape: str, context: int, requests_each: int = 1
                     ) -> dict[str, Callable[[int], float]]:
    """``shape``'s stage costs recorded in ``path`` as a clock profile, each simulated
    request standing for ``requests_each`` real ones. Host time per step is what the
    profile saw on the host: inside the forward, plus the time the GPU waited for it.
    Beyond the largest recorded batch the cost grows on the line through the two largest."""
    [record] = [r for r in json.loads(Path(path).read_text()) if r["shape"] == shape]
    rows = sorted((r for r in record["rows"] if r["context"] == context), key=lambda r: r["batch"])
    batch = [r["batch"] for r in rows]

    def cost(values: list[float]) -> Callable[[int], float]:
        slope = (values[-1] - values[-2]) / (batch[-1] - batch[-2])

        def at(tokens: int) -> float:
            n = tokens * requests_each
            return float(np.interp(n, batch, values)) + slope * max(0, n - batch[-1])
        return at

    return {"host_ms": cost([r["forward_ms"] + max(0.0, r["period_ms"] - r["kernel_ms"])
                             for r in rows]),
            "forward_ms": cost([r["kernel_ms"] for r in rows])}


@contextmanager
def cadence_on_clock(cadence: str, clock: PipelineClock) -> Iterator[PPCudaGraphSettings | None]:
    """The settings of the plugin's scheduler for ``cadence`` (None for ``vllm``: stock's
    scheduler), with ``auto``'s chooser, built inside, measuring on ``clock``."""
    settings = None if cadence == "vllm" else PPCudaGraphSettings(decode_cadence=cadence,
                                                                   metrics=False)
    with mock.patch.object(decode_cadence, "CadenceChooser",
                           functools.partial(CadenceChooser, clock=clock)):
        yield settings


def empty_scheduler(model_dir: str, max_num_seqs: int, prompt: int, output: int,
                    pp: int = 2, settings: PPCudaGraphSettings | None = None) -> AsyncScheduler:
    """vLLM's async scheduler at PP=``pp`` (the plugin's where ``settings`` ask for a
    cadence) with room for ``max_num_seqs`` requests of ``prompt`` + ``output`` tokens to
    the end, and for all their prompts in one step; none added yet."""
    max_len = prompt + output + BLOCK
    return make_scheduler(model_dir, num_blocks=max_num_seqs * (max_len // BLOCK + 2), pp=pp,
                          max_num_seqs=max_num_seqs, settings=settings,
                          max_model_len=max_len, max_num_batched_tokens=8192)


def _sampled(scheduler, output) -> ModelRunnerOutput:
    """The last stage's output: a token for each request whose tokens are all computed."""
    ids = list(output.num_scheduled_tokens)
    tokens = []
    for rid in ids:
        request = scheduler.requests.get(rid)  # gone once finished by an earlier output
        done = request is not None and request.num_computed_tokens >= request.num_tokens
        tokens.append([7] if done else [])
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=tokens)


@dataclass
class PassResult:
    """One pass: requests per simulated second, and each request's time to its first
    token and per output token after it (ms, in the order they finished)."""

    req_per_s: float
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)


def arrival_times(size: int, rate_per_s: float | None, start_ms: float,
                  rng: np.random.Generator) -> list[float]:
    """When each of a pass's ``size`` requests arrives: all at its start (a closed loop,
    which sends each as soon as there is room), or as a Poisson process at ``rate_per_s``."""
    if rate_per_s is None:
        return [start_ms] * size
    return list(start_ms + np.cumsum(rng.exponential(1000 / rate_per_s, size)))


def serve_passes(scheduler, clock: PipelineClock, passes: list[int], concurrency: int,
                 input_len: int, output_len: int, rate_per_s: float | None = None,
                 seed: int = 0) -> list[PassResult]:
    """Each pass: ``passes[i]`` requests kept ``concurrency`` at a time (a new one as one
    finishes), or arriving at ``rate_per_s`` with at most ``concurrency`` in flight (as
    ``vllm bench serve --request-rate``); the engine drained between passes,
    ``pp_size + 1`` steps in flight as in the engine core."""
    results, next_id, rng = [], 0, np.random.default_rng(seed)
    for size in passes:
        sent = done = 0
        start, in_flight = clock.now_ms, deque()
        due = arrival_times(size, rate_per_s, start, rng)
        arrived: dict[str, float] = {}
        first_token: dict[str, float] = {}
        result = PassResult(0.0)
        while done < size:
            if (sent < size and not in_flight and not scheduler.has_requests()
                    and due[sent] > clock.now_ms):
                clock.now_ms = due[sent]  # idle until the next request arrives
            while sent < size and sent - done < concurrency and due[sent] <= clock.now_ms:
                rid = str(next_id)
                scheduler.add_request(Request(
                    request_id=rid, prompt_token_ids=[5] * input_len,
                    sampling_params=SamplingParams(max_tokens=output_len, ignore_eos=True),
                    pooling_params=None))
                # As vllm bench serve times them: from when the client sends, which in a
                # closed loop is when a slot frees, in an open one when the request is due.
                arrived[rid] = clock.now_ms if rate_per_s is None else due[sent]
                next_id, sent = next_id + 1, sent + 1
            if scheduler.has_requests():
                output = scheduler.schedule()
                clock.run(output)
                _note_first_tokens(scheduler, output, clock, first_token)
                in_flight.append(output)
                if len(in_flight) < scheduler.pp_size + 1 and scheduler.has_requests():
                    continue
            if not in_flight:
                continue
            output = in_flight.popleft()
            outputs = scheduler.update_from_output(output, _sampled(scheduler, output))
            for finished in (o for engine in outputs.values() for o in engine.outputs
                             if o.finish_reason is not None):
                rid, done = finished.request_id, done + 1
                result.ttft_ms.append(first_token[rid] - arrived[rid])
                result.tpot_ms.append((clock.token_ready[rid] - first_token[rid])
                                      / max(1, output_len - 1))
        while in_flight:
            output = in_flight.popleft()
            scheduler.update_from_output(output, _sampled(scheduler, output))
        result.req_per_s = size / ((clock.end_ms - start) / 1000)
        results.append(result)
    return results


def _note_first_tokens(scheduler, output, clock: PipelineClock,
                       first_token: dict[str, float]) -> None:
    """The step that completes a request's prompt gives its first token at its end."""
    for rid in output.num_scheduled_tokens:
        request = scheduler.requests.get(rid)
        if (rid not in first_token and request is not None
                and request.num_computed_tokens >= request.num_prompt_tokens):
            first_token[rid] = clock.token_ready[rid]


def simulate(model_dir: str, cadence: str, profile: dict, *, pp: int, concurrency: int,
             pass_requests: int, passes: int, input_len: int, output_len: int,
             request_rate: float | None = None) -> dict[str, Any]:
    """One cadence on a fresh scheduler timed with ``profile``: a warm-up pass of
    ``concurrency`` requests, then ``passes`` timed passes of ``pass_requests``."""
    clock = PipelineClock(pp, **profile)
    with cadence_on_clock(cadence, clock) as settings:
        scheduler = empty_scheduler(model_dir, concurrency, input_len, output_len, pp,
                                    settings=settings)
        _, *timed = serve_passes(scheduler, clock, [concurrency] + [pass_requests] * passes,
                                 concurrency, input_len, output_len, request_rate)
    chooser = getattr(scheduler, "chooser", None)
    return {"cadence": cadence, "pass_req_per_s": [p.req_per_s for p in timed],
            "trials": dict(chooser.trials) if chooser else None,
            "switches": [(step, str(c)) for step, c, *_ in chooser.switches] if chooser else None}
