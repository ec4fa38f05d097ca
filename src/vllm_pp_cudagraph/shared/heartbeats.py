"""Each rank's heartbeat file, mapped and updated in place at each phase of a step (no system
call), so another process of the host sees how far it got even while stopped. Stdlib only."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

#: The signal on which a pipeline worker writes its threads' stacks to its stderr.
STACKS_SIGNAL = signal.SIGUSR1
# pid, stage, tp rank, phase, steps begun, steps done, phase since, last step done at
# (time.monotonic(): one clock for every process of a host), then the host name.
_LAYOUT = struct.Struct("<qiiiqqdd64s")


class Phase(IntEnum):
    """Where a rank is; the names are what a stall report says."""

    BETWEEN_STEPS = 0
    FORWARD = 1
    RECEIVING_TOKENS = 2
    SAMPLING = 3

    def describe(self) -> str:
        return {Phase.BETWEEN_STEPS: "between steps (in the worker's hand-off send or receive, "
                                     "or waiting for the engine's next step)",
                Phase.FORWARD: "in its forward pass",
                Phase.RECEIVING_TOKENS: "receiving the last stage's sampled tokens",
                Phase.SAMPLING: "sampling"}[self]


def heartbeat_path(directory: Path, engine: int, stage: int, tp_rank: int) -> Path:
    return directory / f"heartbeat-{engine}-{stage}-{tp_rank}.bin"


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat as read."""

    pid: int
    stage: int
    tp_rank: int
    phase: Phase
    begun: int
    done: int
    phase_since: float
    done_at: float
    host: str

    def where(self, now: float) -> str:
        """What the rank is doing, for a stall report."""
        step = f"of step {self.begun}" if self.begun > self.done else f"after step {self.done}"
        return f"{self.phase.describe()} {step}, for {now - self.phase_since:.0f} s"


class Heartbeat:
    """A rank's own heartbeat file, written in place."""

    def __init__(self, path: Path, stage: int, tp_rank: int, clock=time.monotonic) -> None:
        self.path, self.stage, self.tp_rank, self.clock = path, stage, tp_rank, clock
        self.begun, self.done, self.phase = 0, 0, Phase.BETWEEN_STEPS
        self.phase_since = self.done_at = clock()
        self.host = socket.gethostname().encode()[:64]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, _LAYOUT.size)
            self._map = mmap.mmap(fd, _LAYOUT.size)
        finally:
            os.close(fd)
        self._write()

    def _write(self) -> None:
        _LAYOUT.pack_into(self._map, 0, os.getpid(), self.stage, self.tp_rank, self.phase,
                          self.begun, self.done, self.phase_since, self.done_at, self.host)

    @property
    def in_step(self) -> bool:
        return self.begun > self.done

    def begin(self) -> None:
        self.begun += 1
        self.enter(Phase.FORWARD)

    def enter(self, phase: Phase) -> None:
        self.phase, self.phase_since = phase, self.clock()
        self._write()

    def step_done(self) -> None:
        """The rank finished its part of the step it began last."""
        self.done, self.phase = self.begun, Phase.BETWEEN_STEPS
        self.phase_since = self.done_at = self.clock()
        self._write()


def read_beats(directory: Path, engine: int) -> list[Beat]:
    """The heartbeats of ``engine``'s ranks on this host, by stage and TP rank."""
    beats = []
    for path in sorted(directory.glob(f"heartbeat-{engine}-*-*.bin")):
        try:
            pid, stage, tp_rank, phase, begun, done, since, done_at, host = _LAYOUT.unpack(
                path.read_bytes()[:_LAYOUT.size])
            beats.append(Beat(pid, stage, tp_rank, Phase(phase), begun, done, since,
                              done_at, host.rstrip(b"\0").decode(errors="replace")))
        except (OSError, struct.error, ValueError):
            continue  # written by another version, or removed meanwhile
    return sorted(beats, key=lambda b: (b.stage, b.tp_rank))


def process_state(pid: int) -> str | None:
    """A process's state letter on this host (``T``: stopped by a signal), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def flush_logs() -> None:
    """Flush the log handlers and standard streams, best effort, before this process ends."""
    for out in [*logging.getLogger().handlers, *logging.getLogger("vllm").handlers,
                sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):  # the reader may be gone
            out.flush()
