"""A first pipeline stage fed through vLLM's real ``PPHandler`` ring, and a serving run of
the real scheduler through it: what the cadence tests and the pipeline simulation's tests
check the first stage's inputs with.

A request that decodes on a first stage must read the token the last stage sampled at
its previous step: the agreement between the scheduler's cadence and the worker's ring
that a wrong patch breaks (the first stage would embed a stale token, with no error).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
from _scheduler import drive, wrong_outputs
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import Request
from vllm.v1.worker.gpu.pp_utils import PendingRecv, PPHandler

from vllm_pp_cudagraph.worker.pipeline.first_stage_tokens import (
    batch_req_indices,
    consume_entries_needed_by,
)

MAX_REQS = 16


class _HostStream:
    """Stands in for the CUDA stream that waits on a broadcast: on CPU, tokens are there."""

    def wait_event(self, event) -> None:
        pass


class FirstStage:
    """A first pipeline stage's request state, fed through vLLM's ``PPHandler`` ring."""

    def __init__(self, pp_size: int, early_consume: bool):
        handler = PPHandler.__new__(PPHandler)
        handler.is_last_rank = False
        handler.device = torch.device("cpu")
        handler.main_stream = _HostStream()
        handler.queue = deque([None] * pp_size)
        handler.req_idx_gen_np = np.zeros(MAX_REQS, dtype=np.int32)
        self.handler = handler
        self.early_consume = early_consume
        self.index: dict[str, int] = {}
        self.free = list(range(MAX_REQS))
        self.last_sampled = np.full(MAX_REQS, -1, dtype=np.int64)
        #: Ring entries the plugin's early consume took before vLLM's own consume would.
        self.consumed_early = 0

    def _apply(self, outputs: dict | None) -> None:
        if outputs is None:
            return
        rows = outputs["idx_mapping"].numpy()
        for row, req_idx in enumerate(rows):
            count = int(outputs["num_sampled"][row])
            if req_idx >= 0 and count:
                self.last_sampled[req_idx] = int(outputs["sampled_tokens"][row, count - 1])

    def start_step(self, output) -> dict[str, int]:
        """What the runner does before the forward; returns each cached request's input token."""
        self._apply(self.handler.get_prev_sampled_outputs())
        if self.early_consume:
            needed = batch_req_indices(output.scheduled_cached_reqs.req_ids, self.index)
            pending = sum(entry is not None for entry in self.handler.queue)
            for outputs in consume_entries_needed_by(self.handler, needed):
                self._apply(outputs)
            self.consumed_early += pending - sum(entry is not None for entry in self.handler.queue)
        for req_id in output.finished_req_ids | (output.preempted_req_ids or set()):
            self._free(req_id)
        for data in output.scheduled_new_reqs:
            self._free(data.req_id)
            self.index[data.req_id] = self.free.pop()
        return {r: int(self.last_sampled[self.index[r]]) for r in output.scheduled_cached_reqs.req_ids}

    def _free(self, req_id: str) -> None:
        req_idx = self.index.pop(req_id, None)
        if req_idx is not None:
            self.handler.on_req_idx_freed(req_idx)
            self.free.append(req_idx)

    def receive(self, output, sampled: dict[str, int]) -> None:
        """The broadcast of the last stage's tokens for this step, as ``PPHandler.receive`` queues it."""
        ids = list(output.num_scheduled_tokens)
        if not any(r in sampled for r in ids):
            return
        idx = np.array([self.index[r] for r in ids], dtype=np.int32)
        self.handler.queue[-1] = PendingRecv(
            event=None,
            sampled_tokens=torch.tensor([[sampled.get(r, -1)] for r in ids]),
            num_sampled=torch.tensor([int(r in sampled) for r in ids]),
            num_rejected=torch.zeros(len(ids), dtype=torch.int32),
            idx_mapping=torch.from_numpy(idx),
            idx_mapping_np=idx,
            need_sampled_mask=np.array([r in sampled for r in ids]),
            gen_at_receive_np=self.handler.req_idx_gen_np[idx].copy(),
        )


class Run:
    """What one simulated serving run produced."""

    def __init__(self):
        self.requests: list[Request] = []
        self.steps: list[frozenset[str]] = []
        self.problems: list[str] = []
        self.consumed_early = 0


def serve(scheduler: AsyncScheduler, requests: list[Request], arrivals: list[int],
          early_consume: bool = True, clock=None) -> Run:
    """Run the requests through the scheduler and a first stage; collect what went wrong.

    With ``clock``, each step is also timed on a simulated pipeline.
    """
    run = Run()
    run.requests = requests
    stage = FirstStage(scheduler.pp_size, early_consume)
    previous_token: dict[str, int | None] = {}

    def on_step(output, sampled: dict[str, int]) -> None:
        run.steps.append(frozenset(output.num_scheduled_tokens))
        for req_id, token in stage.start_step(output).items():
            expected = previous_token.get(req_id)
            if expected is not None and token != expected:
                run.problems.append(f"step {len(run.steps)} request {req_id}: first stage read "
                                    f"{token}, last stage sampled {expected}")
        for rid in output.num_scheduled_tokens:
            previous_token[rid] = sampled.get(rid)
        stage.receive(output, sampled)
        if clock is not None:
            clock.run(output)

    drive(scheduler, requests, arrivals, on_step)
    run.problems += wrong_outputs(requests)
    run.consumed_early = stage.consumed_early
    return run
