"""Judge two engines' greedy tokens where they differ: rounding, or a fault?

Two engines given the same batches can still part ways: their kernels may round
differently (a freshly autotuned kernel, another compiled graph), and where the
model's top two choices are nearly tied, one ulp decides. Comparing digests
then cannot tell a plugin fault from stock's own engine-to-engine noise.

This looks at each differing request's first divergence, the one position where
both engines saw the same context. There each engine's own logprobs say how far
below its top choice the other engine's token lay. Both within
:data:`NEAR_TIE_NATS`: the engines chose between near ties, as rounding does.
Either beyond (or outside the recorded top ``k``): a token the model would not
pick, as a fault gives (another request's token, a lost step, garbage).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: Top logprobs each output position records for the judge.
TOP_LOGPROBS = 8

#: How far below an engine's top choice, in nats, the other engine's token may lie
#: at a first divergence for the two to count as a near tie. Stock's own served
#: tokens lie up to 0.047 below the top choice on the bench's random-weight shape
#: (three bfloat16 steps of its logits); a token of another request lies 1.4 or
#: more below it. A real checkpoint's larger logits round in larger steps: the bench
#: takes another bound (``--near-tie-nats``), and stock's control says if it is too tight.
NEAR_TIE_NATS = 0.1


@dataclass(frozen=True)
class TokenRecord:
    """One engine's greedy outputs: per request, its tokens and, per position, the
    top logprobs as {token id: logprob}."""

    tokens: list[list[int]]
    logprobs: list[list[dict[int, float]]]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"tokens": self.tokens, "logprobs": [
            [{str(k): v for k, v in pos.items()} for pos in request]
            for request in self.logprobs]}))

    @classmethod
    def load(cls, path: Path) -> "TokenRecord":
        data = json.loads(Path(path).read_text())
        return cls(data["tokens"], [[{int(k): v for k, v in pos.items()} for pos in request]
                                    for request in data["logprobs"]])


def record_of(outputs: list) -> TokenRecord:
    """A TokenRecord of vLLM ``RequestOutput``s generated with ``logprobs`` set."""
    tokens, logprobs = [], []
    for out in outputs:
        completion = out.outputs[0]
        tokens.append(list(completion.token_ids))
        logprobs.append([{int(k): round(float(v.logprob), 4) for k, v in position.items()}
                         for position in (completion.logprobs or [])])
    return TokenRecord(tokens, logprobs)


@dataclass(frozen=True)
class Divergence:
    """Where one request's tokens first differ, and how far below each engine's top
    choice the other engine's token lay there (None: not in its recorded top k)."""

    request: int
    position: int
    tokens: tuple[int | None, int | None]
    margins: tuple[float | None, float | None]

    def near_tie(self, bound: float = NEAR_TIE_NATS) -> bool:
        return all(m is not None and m <= bound for m in self.margins)


def _margin(position: dict[int, float], other: int | None) -> float | None:
    if other not in position:  # None (a run that stopped), or beyond the recorded top k
        return None
    return round(max(position.values()) - position[other], 6)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where ``a`` and ``b`` differ (a length counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergences(a: TokenRecord, b: TokenRecord) -> list[Divergence]:
    """Each differing request's first divergence between ``a`` and ``b``."""
    if len(a.tokens) != len(b.tokens):
        raise ValueError(f"the runs hold {len(a.tokens)} and {len(b.tokens)} requests: "
                         "only runs of the same batches can be judged")
    found = []
    for i, (ta, tb) in enumerate(zip(a.tokens, b.tokens)):
        at = first_divergence(ta, tb)
        if at is None:
            continue
        x = ta[at] if at < len(ta) else None
        y = tb[at] if at < len(tb) else None
        la = a.logprobs[i][at] if at < len(a.logprobs[i]) else {}
        lb = b.logprobs[i][at] if at < len(b.logprobs[i]) else {}
        found.append(Divergence(i, at, (x, y), (_margin(la, y), _margin(lb, x))))
    return found


def judge(a: TokenRecord, b: TokenRecord, bound: float = NEAR_TIE_NATS) -> dict[str, Any]:
    """``verdict``: "identical", "near-ties" (every divergence within ``bound``) or
    "differ"; with the counts, the largest margin and the divergences beyond."""
    found = divergences(a, b)
    beyond = [d for d in found if not d.near_tie(bound)]
    margins = [m for d in found for m in d.margins if m is not None]
    verdict = "identical" if not found else "near-ties" if not beyond else "differ"
    return {
        "verdict": verdict,
        "requests": len(a.tokens),
        "requests_differ": len(found),
        "beyond_near_tie": len(beyond),
        "near_tie_nats": bound,
        "largest_margin": max(margins, default=None),
        "first_beyond": [asdict(d) for d in beyond[:5]],
    }
