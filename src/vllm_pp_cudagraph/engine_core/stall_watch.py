"""The engine core's watch over its pipeline: a stage that hangs with work in flight is named and
stopped in seconds, as when a worker dies, not after ``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from vllm_pp_cudagraph.shared.heartbeats import (STACKS_SIGNAL, Beat, flush_logs, process_state,
                                                 read_beats)

logger = logging.getLogger("vllm.pp_cudagraph.stall_watch")

SETTING = "VLLM_PP_CUDAGRAPH_STALL_LIMIT_S"
#: The limit is at least this many times the longest a step has been out so far.
LONGEST_STEP_FACTOR = 5.0
#: Seconds the stuck stage is given to write its stacks before it is killed.
DUMP_WAIT_S = 0.5
#: Seconds vLLM is given to stop the server after the stuck worker is killed, before the
#: engine core exits by itself (a stage on another host, or an executor that did not notice).
STOP_GRACE_S = 6.0
#: Exit status of an engine core that stops itself (EX_SOFTWARE, as a failed worker's).
EXIT_CODE = 70


@dataclass(frozen=True)
class Verdict:
    """The rank the watch holds stuck, and what it saw."""
    stage: int
    tp_rank: int
    beat: Beat | None  # None: the rank runs on another host
    why: str

    def names(self) -> str:
        where = ("on another host" if self.beat is None
                 else f"host {self.beat.host}, pid {self.beat.pid}")
        return f"pipeline stage {self.stage} (TP rank {self.tp_rank}, {where})"


def stuck_rank(beats: list[Beat], pp_size: int, tp_size: int, now: float,
               state: Callable[[int], str | None] = process_state) -> Verdict:
    """The rank holding the pipeline up, from this host's heartbeats: one whose process is stopped
    or gone; else, as a stage finishes a step only after those before it, the first with the fewest
    steps done, within a stage one not in the step (a TP peer missing a collective) if any."""
    for beat in beats:
        if (letter := state(beat.pid)) in ("T", "t"):
            return Verdict(beat.stage, beat.tp_rank, beat,
                           f"its process is stopped by a signal (state {letter}), "
                           f"{beat.where(now)}")
        if letter is None:
            return Verdict(beat.stage, beat.tp_rank, beat,
                           f"its process is gone, {beat.where(now)}")
    seen = {(b.stage, b.tp_rank) for b in beats}
    elsewhere = sorted({stage for stage in range(pp_size) for tp in range(tp_size)
                        if (stage, tp) not in seen})
    note = f"; stages {elsewhere} run on other hosts, not seen here" if elsewhere else ""
    if not beats:
        return Verdict(0, 0, None, "no rank of this engine runs on this host" + note)
    fewest = min(b.done for b in beats)
    behind = [b for b in beats if b.done == fewest]
    first_stage = [b for b in behind if b.stage == behind[0].stage]
    beat = next((b for b in first_stage if b.begun == b.done), first_stage[0])
    return Verdict(beat.stage, beat.tp_rank, beat, beat.where(now) + note)


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def stop_engine(verdict: Verdict, beats: Iterable[Beat], *,
                send: Callable[[int, int], None] = _send,
                sleep: Callable[[float], None] = time.sleep,
                exit_process: Callable[[int], None] = os._exit) -> None:
    """Have the stuck stage dump its stacks (the others, where its process is stopped) and kill
    its ranks on this host; end this engine core if it still runs ``STOP_GRACE_S`` later."""
    local = [b for b in beats if b.stage == verdict.stage]
    # A stopped process cannot write its stacks: then the others' show what they wait on.
    stopped = verdict.beat is not None and "stopped by a signal" in verdict.why
    for beat in [b for b in beats if b.stage != verdict.stage] if stopped else local:
        send(beat.pid, STACKS_SIGNAL)
    sleep(DUMP_WAIT_S)
    for beat in local:
        send(beat.pid, signal.SIGKILL)
    sleep(STOP_GRACE_S if local else 0.0)
    logger.critical("The engine core ends itself (exit %d): vLLM had not stopped the server "
                    "%.0f s after the stuck stage was killed, or that stage runs on another "
                    "host.", EXIT_CODE, STOP_GRACE_S)
    flush_logs()
    exit_process(EXIT_CODE)


class StallWatch:
    """Watches the steps handed out (``in_flight``: vLLM's batch queue entries, a step's future
    first); ``act`` gets the verdict and heartbeats once one is out past the limit."""

    def __init__(self, in_flight: Callable[[], list[tuple]], directory: Path, engine: int,
                 pp_size: int, tp_size: int, limit_s: float,
                 act: Callable[[Verdict, list[Beat]], None] = stop_engine,
                 poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.in_flight = in_flight
        self.directory, self.engine = directory, engine
        self.pp_size, self.tp_size = pp_size, tp_size
        self.limit_s = limit_s
        self.act = act
        self.poll_s, self.clock = poll_s, clock
        # The steps seen out and not yet back, oldest first, with when each was first seen.
        self._out: list[tuple[tuple, float]] = []
        self.longest_s = 0.0  # the longest a step has been out so far
        self.fired: Verdict | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def limit(self) -> float:
        return max(self.limit_s, LONGEST_STEP_FACTOR * self.longest_s)

    def check(self) -> Verdict | None:
        """One look; the verdict when the oldest step out has been out past the limit."""
        now = self.clock()
        kept = []
        for entry, since in self._out:
            if entry[0].done():
                self.longest_s = max(self.longest_s, now - since)
            else:
                kept.append((entry, since))
        try:
            current = list(self.in_flight())
        except (IndexError, RuntimeError):  # the engine changed its queue meanwhile
            current = []
        known = {id(entry) for entry, _ in kept}
        kept += [(entry, now) for entry in reversed(current)
                 if id(entry) not in known and not entry[0].done()]
        self._out = kept
        if not kept or now - kept[0][1] <= self.limit():
            return None
        return stuck_rank(read_beats(self.directory, self.engine), self.pp_size, self.tp_size, now)

    def report(self, verdict: Verdict, waited_s: float) -> str:
        return (f"vllm-pp-cudagraph: {verdict.names()} is stuck: no step came back for "
                f"{waited_s:.0f} s with work in flight ({verdict.why}). Stopping the server "
                f"(stall limit {self.limit():.0f} s, {SETTING}).")

    def run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if (verdict := self.check()) is not None:
                self.fired = verdict
                logger.critical("%s", self.report(verdict, self.clock() - self._out[0][1]))
                flush_logs()
                self.act(verdict, read_beats(self.directory, self.engine))
                return

    def start(self) -> StallWatch:
        self._thread = threading.Thread(target=self.run, daemon=True,
                                        name="pp-cudagraph-stall-watch")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
