"""One stage's step timings: CUDA events around each serving step, read once complete so the
step never waits on the GPU; every few seconds a :class:`StageSnapshot` is written."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vllm_pp_cudagraph.shared.snapshots import INTERVAL_S, StageSnapshot, write_snapshot


@dataclass(frozen=True)
class _Window:
    """A snapshot's span from ``start`` (clock seconds) and the running totals then."""

    start: float
    steps: int
    busy_ms: float
    idle_ms: float


@dataclass
class StageClock:
    """Times one stage's serving steps (its TP rank 0 only; the others skip)."""

    stage: int
    pp_size: int
    tp_size: int
    layers: int
    predicted_step_ms: float | None = None
    engine: int = 0
    interval_s: float = INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    write: Callable[[StageSnapshot], object] = write_snapshot
    event: Callable[[], torch.cuda.Event] = field(default=lambda: _event(), repr=False)
    _pending: deque = field(default_factory=deque)
    _open: torch.cuda.Event | None = None
    _last_end: torch.cuda.Event | None = None
    _window: _Window | None = None
    handoff_bytes_total: int = 0
    graph_steps_total: int = 0
    eager_steps_total: int = 0
    #: Since the stage started: steps timed, and their GPU time busy and waiting (ms).
    timed_steps_total: int = 0
    busy_ms_total: float = 0.0
    idle_ms_total: float = 0.0

    def step_started(self) -> None:
        if self._open is None:
            self._open = self.event()

    def step_ended(self, graph: bool, handoff_bytes: int = 0) -> None:
        if self._open is None:
            return
        self._pending.append((self._open, self.event()))
        self._open = None
        self.handoff_bytes_total += handoff_bytes
        if graph:
            self.graph_steps_total += 1
        else:
            self.eager_steps_total += 1
        self._harvest()

    def _harvest(self) -> None:
        now = self.clock()
        window = self._window = self._window or self._open_window(now)
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.popleft()
            self.timed_steps_total += 1
            self.busy_ms_total += start.elapsed_time(end)
            if self._last_end is not None:
                self.idle_ms_total += max(0.0, self._last_end.elapsed_time(start))
            self._last_end = end
        if now - window.start >= self.interval_s and self.timed_steps_total > window.steps:
            self.write(self._snapshot(window, now))
            self._window = self._open_window(now)

    def _open_window(self, now: float) -> _Window:
        return _Window(now, self.timed_steps_total, self.busy_ms_total, self.idle_ms_total)

    def _snapshot(self, window: _Window, now: float) -> StageSnapshot:
        steps = self.timed_steps_total - window.steps
        busy_ms = self.busy_ms_total - window.busy_ms
        idle_ms = self.idle_ms_total - window.idle_ms
        gpu_ms = busy_ms + idle_ms
        return StageSnapshot(
            stage=self.stage, pp_size=self.pp_size, tp_size=self.tp_size, engine=self.engine,
            time=time.time(), window_s=now - window.start, steps=steps,
            busy_fraction=busy_ms / gpu_ms if gpu_ms else 1.0,
            wait_fraction=idle_ms / gpu_ms if gpu_ms else 0.0,
            step_ms=busy_ms / steps,
            handoff_bytes_total=self.handoff_bytes_total,
            graph_steps_total=self.graph_steps_total, eager_steps_total=self.eager_steps_total,
            timed_steps_total=self.timed_steps_total, busy_ms_total=self.busy_ms_total,
            idle_ms_total=self.idle_ms_total,
            layers=self.layers, predicted_step_ms=self.predicted_step_ms)


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
