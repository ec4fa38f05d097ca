"""Pool the runs of several serving soaks and judge them together.

One soak's shares of differing requests move by several points from one run to
the next, more than the margins the soak is held to. Every soak sends the same
requests for a given ``--requests`` (same prompts, same streaming and
cancellation plan), and keeps each request's text digest in ``soak.json``, so
runs of different soaks can be compared request by request. This pools every
run of the same load and configuration (request count, output length, mode,
model shape and weights, LoRA adapters, plugin runner, stock mode, preemption, batch invariance) across the given
soaks and applies the soak's rule to the pooled means: the plugin's share
against stock, over every plugin-stock pair of runs, may be no higher than
stock's share against itself, over every pair of stock runs. For scale, it
also applies the rule to stock alone, with stock runs cast as the plugin, and
says in how many castings it fails: the verdict stays the rule's.

    python -m benchmarks.tools.soak_pool RESULTS/*/soak.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.tools.soak import compared_pairs
from benchmarks.tools.soak_judge import share_differing

Digests = list[str | None]

#: What must be equal for runs of two soaks to be pooled: the load (same
#: requests, same length) and the configuration.
CONFIG_KEYS = ("pp", "requests", "max_tokens", "mode", "shape", "weights", "lora", "plugin_runner",
               "stock_mode", "preemption", "batch_invariant")
#: What soaks from before a key was recorded ran with.
CONFIG_DEFAULTS = {"pp": 2, "shape": "qwen3-0.6b", "weights": "random", "lora": 0}


def pooled_runs(results: list[dict]) -> dict[tuple, dict[str, Digests]]:
    """Per configuration, every run of every soak that kept digests, by a unique name.

    A run keeps its soak's name (``plugin``, ``stock_a``, ...), which says its
    side, with the index of its soak result appended.
    """
    pools: dict[tuple, dict[str, Digests]] = defaultdict(dict)
    for index, result in enumerate(results):
        digests = result.get("request_digests")
        if not digests:
            continue
        config = tuple(str(result.get(key, CONFIG_DEFAULTS.get(key))) for key in CONFIG_KEYS)
        for name, run in digests.items():
            pools[config][f"{name}@{index}"] = run
    return dict(pools)


def _rule(runs: dict[str, Digests]) -> dict:
    """The soak's rule on pooled runs: mean plugin-stock share against mean stock-stock share.

    The pairs are the soak's own (:func:`~benchmarks.tools.soak.compared_pairs`).
    """
    pairs = compared_pairs(list(runs))
    shares = {kind: [share_differing(runs[x], runs[y]) for x, y in pairs[kind]]
              for kind in ("plugin_vs_stock", "stock_vs_stock")}
    cross, own = shares["plugin_vs_stock"], shares["stock_vs_stock"]
    verdict: dict = {"plugin_runs": sum(n.startswith("plugin") for n in runs),
                     "stock_runs": sum(n.startswith("stock") for n in runs)}
    if not cross or not own or any(math.isnan(x) for x in cross + own):
        return verdict | {"passed": False,
                          "problem": "needs a plugin run and two stock runs with requests in common"}
    verdict |= {"plugin_vs_stock": statistics.fmean(cross), "stock_vs_stock": statistics.fmean(own),
                "pairs": {"plugin_vs_stock": len(cross), "stock_vs_stock": len(own)}}
    verdict["passed"] = verdict["plugin_vs_stock"] <= verdict["stock_vs_stock"]
    return verdict


def stock_cast_as_plugin(runs: dict[str, Digests]) -> dict | None:
    """How often the rule fails stock against itself, for scale.

    Every choice of stock runs, as many as the plugin has (keeping two as
    stock), takes the plugin's part and the rule is applied to stock runs
    alone. A rule that fails some of these castings fails stock vLLM by run-to-run
    variation alone; None when there are too few stock runs to cast.
    """
    stock = [n for n in runs if n.startswith("stock")]
    size = min(sum(n.startswith("plugin") for n in runs), len(stock) - 2)
    if size < 1:
        return None
    castings = list(itertools.combinations(stock, size))
    failing = sum(
        not _rule({f"{'plugin' if n in cast else 'stock'}#{n}": runs[n] for n in stock})["passed"]
        for cast in castings)
    return {"castings": len(castings), "failing": failing}


def judge(runs: dict[str, Digests]) -> dict:
    """The soak's rule on pooled runs, with how often it fails stock cast as the plugin."""
    verdict = _rule(runs)
    if "pairs" in verdict:
        verdict["stock_cast_as_plugin"] = stock_cast_as_plugin(runs)
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("soaks", nargs="+", type=Path, help="soak.json files")
    args = parser.parse_args(argv)
    results = [r for path in args.soaks for r in json.loads(path.read_text())]
    pools = pooled_runs(results)
    if not pools:
        parser.error("no soak result holds request digests (soaks before --plugin-runs kept none)")
    verdicts = []
    for config, runs in sorted(pools.items()):
        verdict = dict(zip(CONFIG_KEYS, config)) | judge(runs)
        verdicts.append(verdict)
        print(json.dumps(verdict), flush=True)
    return 0 if all(v["passed"] for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
