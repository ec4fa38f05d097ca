"""``VLLM_PP_CUDAGRAPH_DECODE_CADENCE=auto``: :class:`CadenceChooser` times vLLM's cadence,
``balance`` and ``merge`` per token, and keeps vLLM's unless another beats it by the margin."""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from vllm.logger import init_logger

from vllm_pp_cudagraph.shared.settings import DecodeCadence

logger = init_logger("vllm.pp_cudagraph.cadence")

#: Windows saw about the same load when their decoding requests differ by at most this share.
SIMILAR_LOAD = 0.25
#: vLLM's own cadence: ``auto`` starts on it and keeps it unless another beats it by the margin.
STOCK = DecodeCadence.VLLM
#: The cadences ``auto`` chooses between, in the order their trials are due.
CANDIDATES = (STOCK, DecodeCadence.BALANCE, DecodeCadence.MERGE)
#: How much faster than the incumbent a trial must measure to be adopted.
MARGIN = 0.05
#: A trial that measured this many times the incumbent's interval lost widely (long back-off).
WIDE_LOSS = 1.25
#: How many of the latest trials' verdicts the chooser keeps for the engine's record.
KEPT_VERDICTS = 32


@dataclass(frozen=True)
class Verdict:
    """How one trial of another cadence ended, at ``decoders`` decoding requests."""
    step: int
    cadence: DecodeCadence
    #: Seconds per token the trial measured (None before a round), and the incumbent's.
    interval: float | None
    against: float | None
    decoders: float
    #: ``adopted``; ``not confirmed`` (the incumbent's next window caught up); ``held``;
    #: ``lost widely``; ``not comparable`` (the load moved during the trial).
    outcome: str


def _similar_load(decoders: float, reference: float, share: float = SIMILAR_LOAD) -> bool:
    return abs(decoders - reference) <= share * max(reference, 1.0)


@dataclass
class _Window:
    """Steps under one cadence, at clock ``times`` (the first its start), by ``round_steps``."""
    round_steps: int
    times: list[float]
    tokens: list[int]
    decoders: list[int]

    def add(self, now: float, tokens: int, decoders: int) -> None:
        self.times.append(now)
        self.tokens.append(tokens)
        self.decoders.append(decoders)

    def token_interval(self, now: float) -> float | None:
        """Seconds a decoding request waited per token: the median over the window's rounds
        (not steps, which alternate long and short where groups are uneven) of a round's time
        per token it gave each decoding request; None if no token was decoded or it idled."""
        durations = [b - a for a, b in zip(self.times, [*self.times[1:], now])]
        elapsed = now - self.times[0]
        longest = max(durations)
        if elapsed <= 0 or (longest > 0.5 * elapsed and longest > 4 * statistics.median(durations)):
            return None
        per_token = []
        for first in range(0, len(durations) - self.round_steps + 1, self.round_steps):
            span = slice(first, first + self.round_steps)
            if tokens := sum(self.tokens[span]):
                decoders = statistics.fmean(self.decoders[span])
                per_token.append(sum(durations[span]) * decoders / tokens)
        return statistics.median(per_token) if per_token else None


@dataclass
class _BackOff:
    """A candidate held off at about ``load`` decoding requests for ``left`` more incumbent
    windows there; its next loss there backs it off ``growth`` times ``gap``."""
    load: float
    gap: int
    left: int


class CadenceChooser:
    """Picks vLLM's cadence, ``balance`` or ``merge`` for one scheduler: feed :meth:`record_step`
    once per ``schedule()``; :attr:`cadence` is the next step's, :attr:`incumbent` the adopted one.
    The incumbent (vLLM's at first) is measured in windows of ``window_rounds`` rounds; another
    (vLLM's too, its trial starting from the incumbent's groups) is tried for a window now and
    then, adopted only if it beats the incumbent by ``margin`` there and in the incumbent's next
    window. Losers are retried ``growth`` times later each time, at the load they lost at; when
    the load moves, the cadence adopted last there resumes, so trials take about the same share
    of steps at every load."""

    window_rounds = 3
    margin = MARGIN
    first_gap = 8
    growth = 4
    longest_gap = 128
    longest_backoff = 1024
    regroup = 0.5  # the share by which decoding requests move before the load counts as moved
    recent = 3  # how many of the incumbent's latest windows its reference is the median of

    def __init__(self, pp_size: int, clock: Callable[[], float] = time.monotonic):
        self.pp_size, self.clock = pp_size, clock
        self.window_steps = self.window_rounds * pp_size
        self.incumbent = self.cadence = STOCK
        #: Whether the incumbent is merge only because too few requests decoded to form groups.
        self._forced = False
        #: Per other candidate: windows of the incumbent between its trials, and left now.
        self._gap = {c: self.first_gap for c in CANDIDATES}
        self._windows_left = {c: 1 for c in CANDIDATES}
        self._back_offs: dict[DecodeCadence, list[_BackOff]] = {c: [] for c in CANDIDATES}
        #: The loads (decoding requests) at which a cadence was adopted, and that cadence.
        self._winners: list[tuple[float, DecodeCadence]] = []
        self._settle = 0
        self._window: _Window | None = None
        self._trial: DecodeCadence | None = None
        #: A winning trial (cadence, token interval, decoding requests) awaiting confirmation.
        self._candidate: tuple[DecodeCadence, float, float] | None = None
        #: The incumbent's last windows (token interval, decoding requests), newest last.
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.recent)
        self._decided_decoders = 0.0
        #: (step, cadence, its token interval, the incumbent's, decoding requests) per switch.
        self.switches: list[tuple[int, DecodeCadence, float, float, float]] = []
        #: Trials started, and steps scheduled under a trial, per cadence (the probes' cost).
        self.trials: Counter[str] = Counter()
        self.trial_steps: Counter[str] = Counter()
        self.wide_losses: Counter[str] = Counter()
        self.verdicts: deque[Verdict] = deque(maxlen=KEPT_VERDICTS)
        self._steps = 0

    def record_step(self, tokens: int, decoders: int) -> DecodeCadence:
        """Account for the step just scheduled; return the cadence for the next."""
        now = self.clock()
        self._steps += 1
        if self.cadence is not self.incumbent:
            self.trial_steps[self.cadence.value] += 1
        if self._settle > 0:
            self._settle -= 1
            self._window = None
            return self.cadence
        if (window := self._window) is None:
            self._window = _Window(self.pp_size, [now], [tokens], [decoders])
            return self.cadence
        if len(window.times) < self.window_steps:
            if self._trial is not None and len(window.times) == self.pp_size:
                # One round of the trial is enough to see it fall far behind.
                interval, reference = window.token_interval(now), self._reference()
                if interval is not None and reference is not None and interval > 1.5 * reference[0]:
                    self._end_trial(interval, statistics.fmean(window.decoders))
                    return self.cadence
            window.add(now, tokens, decoders)
            return self.cadence
        interval = window.token_interval(now)
        self._window = _Window(self.pp_size, [now], [tokens], [decoders])
        if interval is not None:
            self._judge(interval, statistics.fmean(window.decoders))
        return self.cadence

    def _judge(self, interval: float, decoders: float) -> None:
        """Judge the window just measured: a trial's, or the incumbent's (after a win or not)."""
        if self._trial is not None:
            reference = self._reference()
            if (reference is not None and _similar_load(decoders, reference[1])
                    and self._wins(interval, reference[0])):
                # Adopt only once the incumbent's window after the trial confirms it.
                self._candidate = (self._trial, interval, decoders)
                self._trial = None
                self._use(self.incumbent)
            else:
                self._end_trial(interval, decoders)
        elif self._candidate is not None and _similar_load(decoders, self._candidate[2]):
            self._confirm(interval, decoders)
        else:
            self._candidate = None
            self._incumbent_window(interval, decoders)

    def _confirm(self, interval: float, decoders: float) -> None:
        trial, trial_interval, trial_decoders = self._candidate
        self._candidate = None
        self._recent.append((interval, decoders))
        beaten = min(interval, self._reference()[0])
        won = self._wins(trial_interval, beaten)
        self.verdicts.append(Verdict(self._steps, trial, trial_interval, beaten, trial_decoders,
                                     "adopted" if won else "not confirmed"))
        if won:
            self._adopt(trial, trial_interval, trial_decoders, beaten)
        else:
            self._back_off(trial, self.longest_gap)
            self._start_due_trial()

    def _incumbent_window(self, interval: float, decoders: float) -> None:
        moved = not _similar_load(decoders, self._decided_decoders, share=self.regroup)
        if (moved or self._forced) and decoders >= self.pp_size:
            # The load moved: before another trial, measure the cadence adopted last at this
            # load, else the incumbent, or vLLM's where too few requests had forced merge.
            winner = next((cadence for load, cadence in reversed(self._winners)
                           if _similar_load(decoders, load)), None)
            resume = winner or (STOCK if self._forced else self.incumbent)
            self._forced, self.incumbent = False, resume
            self._use(resume)
            self._recent.clear()
            self._decided_decoders = decoders
            self._reset_gaps(decoders, first_trial_in=1)
            return
        self._recent.append((interval, decoders))
        if decoders < self.pp_size:
            # Too few requests to form groups: every other cadence leaves steps empty.
            self._forced, self.incumbent = True, DecodeCadence.MERGE
            self._use(DecodeCadence.MERGE)
            return
        for cadence in CANDIDATES:
            self._windows_left[cadence] -= 1
            if held := self._back_off_at(cadence, decoders):
                held.left -= 1
        self._start_due_trial()

    def _start_due_trial(self) -> None:
        due = [c for c in CANDIDATES if c is not self.incumbent and self._windows_left[c] <= 0]
        if due:
            self._trial = due[0]
            self.trials[due[0].value] += 1
            self._use(due[0])

    def _wins(self, interval: float, incumbent: float) -> bool:
        return interval < incumbent * (1 - self.margin)

    def _reference(self) -> tuple[float, float] | None:
        """The incumbent's interval to beat (recent median near the latest load), and that load."""
        if not self._recent:
            return None
        latest = self._recent[-1][1]
        return statistics.median([i for i, d in self._recent if _similar_load(d, latest)]), latest

    def _end_trial(self, interval: float | None, decoders: float) -> None:
        """Back to the incumbent; retry the trial later, much later if it lost widely."""
        trial, reference = self._trial, self._reference()
        assert trial is not None
        self._trial = None
        self._use(self.incumbent)
        if reference is None or not _similar_load(decoders, reference[1]):
            self._windows_left[trial] = self._gap[trial]  # no back-off
            self.verdicts.append(Verdict(self._steps, trial, interval, None, decoders,
                                         "not comparable"))
            return
        wide = interval is not None and interval >= WIDE_LOSS * reference[0]
        self.verdicts.append(Verdict(self._steps, trial, interval, reference[0], decoders,
                                     "lost widely" if wide else "held"))
        if wide:
            self.wide_losses[trial.value] += 1
        self._back_off(trial, self.longest_backoff if wide else self.longest_gap)

    def _back_off(self, trial: DecodeCadence, longest: int) -> None:
        """Retry ``trial`` at the latest load ``growth`` times later, at most ``longest``."""
        load = self._recent[-1][1]
        earlier = self._back_off_at(trial, load)
        gap = min(self.growth * (earlier.gap if earlier else self._gap[trial]), longest)
        self._gap[trial] = self._windows_left[trial] = gap
        kept = [b for b in self._back_offs[trial] if not _similar_load(load, b.load)]
        self._back_offs[trial] = [*kept, _BackOff(load, gap, gap)]
        self._decided_decoders = load

    def _back_off_at(self, cadence: DecodeCadence, decoders: float) -> _BackOff | None:
        """``cadence``'s back-off nearest ``decoders``, if one is within a load move of it."""
        near = [b for b in self._back_offs[cadence]
                if _similar_load(decoders, b.load, share=self.regroup)]
        return min(near, key=lambda b: abs(math.log(max(decoders, 1.0) / max(b.load, 1.0))),
                   default=None)

    def _adopt(self, cadence: DecodeCadence, interval: float, decoders: float,
               beaten: float) -> None:
        """Make ``cadence`` the incumbent: it measured ``interval`` against ``beaten``."""
        before, self.incumbent = self.incumbent, cadence
        self._forced = False
        self._use(cadence)
        self.switches.append((self._steps, cadence, interval, beaten, decoders))
        logger.info("vllm-pp-cudagraph: decode cadence %s at %.0f decoding requests "
                    "(%.2f ms per token against %.2f ms with %s)",
                    cadence, decoders, 1e3 * interval, 1e3 * beaten, before)
        self._decided_decoders = decoders
        self._winners = [*(w for w in self._winners if not _similar_load(decoders, w[0])),
                         (decoders, cadence)]
        self._back_offs[cadence] = [b for b in self._back_offs[cadence]
                                    if not _similar_load(decoders, b.load)]
        self._recent.clear()
        self._recent.append((interval, decoders))
        self._reset_gaps(decoders, first_trial_in=self.first_gap)

    def _reset_gaps(self, decoders: float, first_trial_in: int) -> None:
        """New load or incumbent: every candidate is due soon but one backed off at this load."""
        for cadence in CANDIDATES:
            held = self._back_off_at(cadence, decoders)
            self._gap[cadence] = held.gap if held else self.first_gap
            self._windows_left[cadence] = max(held.left if held else 0, first_trial_in)

    def _use(self, cadence: DecodeCadence) -> None:
        if cadence is not self.cadence:
            self.cadence = cadence
            self._settle = self.pp_size
            self._window = None
