"""Choose the PP decode cadence by measurement (``VLLM_PP_CUDAGRAPH_DECODE_CADENCE=auto``).

:class:`CadenceChooser` times ``merge`` and ``balance`` in the engine core, per token a
request waits, and keeps the faster; docs/architecture.md and docs/performance.md say why."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.logger import init_logger

from vllm_pp_cudagraph.settings import DecodeCadence

logger = init_logger("vllm.pp_cudagraph.cadence")

#: Windows saw about the same load when their decoding requests differ by at most this share.
SIMILAR_LOAD = 0.25

#: The cadences ``auto`` chooses between.
CANDIDATES = (DecodeCadence.MERGE, DecodeCadence.BALANCE)


def _similar_load(decoders: float, reference: float, share: float = SIMILAR_LOAD) -> bool:
    """Whether ``decoders`` is within ``share`` of ``reference`` (at least one request)."""
    return abs(decoders - reference) <= share * max(reference, 1.0)


@dataclass
class _Window:
    """Steps measured under one cadence since ``start`` (clock seconds)."""

    start: float
    last: float
    steps: int = 0
    tokens: int = 0
    decoders: int = 0
    gaps: list[float] = field(default_factory=list)

    def add(self, now: float, tokens: int, decoders: int) -> None:
        if self.steps:
            self.gaps.append(now - self.last)
        self.last = now
        self.steps += 1
        self.tokens += tokens
        self.decoders += decoders

    @property
    def mean_decoders(self) -> float:
        return self.decoders / self.steps if self.steps else 0.0

    def token_interval(self, now: float) -> float | None:
        """Seconds a decoding request waited per token (from the median gap between steps),
        or None where no token was decoded or the engine was idle."""
        gaps = [*self.gaps, now - self.last]
        elapsed = now - self.start
        step = statistics.median(gaps)
        idle = max(gaps) > 0.5 * elapsed and max(gaps) > 4 * step
        if self.tokens == 0 or elapsed <= 0 or idle:
            return None
        return step * len(gaps) * self.mean_decoders / self.tokens


class CadenceChooser:
    """Picks ``merge`` or ``balance`` for one scheduler: feed :meth:`record_step` once per
    ``schedule()``; :attr:`cadence` is the cadence for the next step."""

    def __init__(
        self,
        pp_size: int,
        window_rounds: int = 3,
        margin: float = 0.05,
        first_gap: int = 8,
        growth: int = 4,
        longest_gap: int = 128,
        regroup: float = 0.5,
        recent: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pp_size = pp_size
        #: Steps per window: every group decodes ``window_rounds`` times in one.
        self.window_steps = window_rounds * pp_size
        self.margin = margin
        self.first_gap = first_gap
        self.growth = growth
        self.longest_gap = longest_gap
        self.regroup = regroup
        self.clock = clock
        # Balance first: it only delays decodes, the closest choice to vLLM's schedule.
        self.cadence = DecodeCadence.BALANCE
        #: Windows of the incumbent to measure before trying the other cadence again.
        self.gap = first_gap
        self._windows_left = 1
        self._settle = 0
        self._window: _Window | None = None
        self._exploring = False
        #: A winning trial (token interval, decoding requests) awaiting confirmation.
        self._candidate: tuple[float, float] | None = None
        #: The incumbent's last windows (token interval, decoding requests), newest last.
        self._recent: deque[tuple[float, float]] = deque(maxlen=recent)
        self._decided_decoders = 0.0
        #: Adopted switches: (step, cadence, its token interval, the other's, decoding requests).
        self.switches: list[tuple[int, DecodeCadence, float, float, float]] = []
        self._steps = 0

    @property
    def other(self) -> DecodeCadence:
        return CANDIDATES[1] if self.cadence is CANDIDATES[0] else CANDIDATES[0]

    def record_step(self, tokens: int, decoders: int) -> DecodeCadence:
        """Account for the step just scheduled; return the cadence for the next."""
        now = self.clock()
        self._steps += 1
        if self._settle > 0:
            self._settle -= 1
            self._window = None
            return self.cadence
        window = self._window
        if window is None:
            self._window = _Window(start=now, last=now)
            self._window.add(now, tokens, decoders)
            return self.cadence
        if window.steps < self.window_steps:
            if self._exploring and window.steps == self.pp_size and self._far_behind(
                    window.token_interval(now)):
                # One round of the trial is enough to see it lose.
                self._keep_incumbent()
                return self.cadence
            window.add(now, tokens, decoders)
            return self.cadence
        interval = window.token_interval(now)
        self._window = _Window(start=now, last=now)
        self._window.add(now, tokens, decoders)
        if interval is not None:
            self._judge(interval, window.mean_decoders)
        return self.cadence

    def _judge(self, interval: float, decoders: float) -> None:
        if self._exploring:
            reference = self._reference()
            comparable = reference is not None and _similar_load(decoders, reference[1])
            if comparable and interval < reference[0] * (1 - self.margin):
                # Adopt only once the incumbent's window after the trial confirms it.
                self._exploring = False
                self._candidate = (interval, decoders)
                self._switch(self.other)
            else:
                self._keep_incumbent(held=comparable)
            return
        if self._candidate is not None:
            trial, trial_decoders = self._candidate
            self._candidate = None
            if _similar_load(decoders, trial_decoders):
                self._recent.append((interval, decoders))
                beaten = min(interval, self._reference()[0])
                if trial < beaten * (1 - self.margin):
                    self._switch(self.other)
                    self._adopt(trial, trial_decoders, beaten=beaten)
                else:
                    self._hold()
                return
        moved = not _similar_load(decoders, self._decided_decoders, share=self.regroup)
        if moved and decoders >= self.pp_size:
            # The load moved: measure the incumbent at the new load before another trial.
            self._recent.clear()
            self._decided_decoders = decoders
            self.gap = self.first_gap
            self._windows_left = 1
            return
        self._recent.append((interval, decoders))
        if decoders < self.pp_size:
            # Too few requests to form groups: balance could only leave steps empty.
            if self.cadence is not DecodeCadence.MERGE:
                self._switch(DecodeCadence.MERGE)
            return
        self._windows_left -= 1
        if self._windows_left <= 0:
            self._exploring = True
            self._switch(self.other)

    def _reference(self) -> tuple[float, float] | None:
        """The incumbent's token interval to beat: the median of its recent windows
        at about the latest one's load, and that load; None before any window."""
        if not self._recent:
            return None
        latest = self._recent[-1][1]
        near = [i for i, d in self._recent if _similar_load(d, latest)]
        return statistics.median(near), latest

    def _far_behind(self, interval: float | None) -> bool:
        reference = self._reference()
        return interval is not None and reference is not None and interval > 1.5 * reference[0]

    def _keep_incumbent(self, held: bool = True) -> None:
        """End a trial and go back; if the incumbent held, ask again less often."""
        self._exploring = False
        self._switch(self.other)
        if held:
            self._hold()
        else:
            self._windows_left = self.gap

    def _hold(self) -> None:
        """The incumbent held against a trial: try the other again less often."""
        self.gap = min(self.growth * self.gap, self.longest_gap)
        self._decided_decoders = self._recent[-1][1]
        self._windows_left = self.gap

    def _adopt(self, interval: float, decoders: float, beaten: float) -> None:
        """Make the trial the incumbent: it measured ``interval`` against ``beaten``."""
        self._exploring = False
        self.switches.append((self._steps, self.cadence, interval, beaten, decoders))
        logger.info(
            "vllm-pp-cudagraph: decode cadence %s at %.0f decoding requests "
            "(%.2f ms per token against %.2f ms with %s)",
            self.cadence, decoders, 1e3 * interval, 1e3 * beaten, self.other,
        )
        self._decided_decoders = decoders
        self._recent.clear()
        self._recent.append((interval, decoders))
        self.gap = self.first_gap
        self._windows_left = self.gap

    def _switch(self, cadence: DecodeCadence) -> None:
        if cadence is not self.cadence:
            self.cadence = cadence
            self._settle = self.pp_size
            self._window = None
