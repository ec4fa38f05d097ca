"""``plan``'s predictions against the cells measured with a GPU per stage.

Reads a list of measured runs (``cells.json``: one object per runner and cell, with
its workload, shape, layout and req/s), predicts each with the same pipeline model
``vllm-pp-cudagraph plan`` uses, and prints a Markdown table of predicted against
measured with the error, and per cell whether the predicted winner is the measured one.

    python -m benchmarks.tools.plan_check CELLS.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.planning.pipeline_model import Prediction
from vllm_pp_cudagraph.planning.plan import predict_run

#: Runners the model predicts with stock MRV2's schedule and cost though they are not
#: stock MRV2 (V1's runner has no term of its own): shown, left out of the winners.
STOCK_SCHEDULE_ONLY = frozenset({"v1", "plugin-cadence"})


def predict(run: dict[str, Any]) -> Prediction | None:
    """The model's prediction for one measured run; None for a runner it does not model."""
    return predict_run(SHAPES[run["shape"]], run)


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        prediction = predict(run)
        if prediction is None or not run.get("req_per_s"):
            continue
        error = prediction.req_per_s / run["req_per_s"] - 1
        out.append({**run, "predicted": prediction.req_per_s, "error": error,
                    "predicted_cadence": prediction.cadence})
    return out


def _load(run: dict[str, Any]) -> str:
    return (f"c={run['concurrency']}" if run["workload"] == "serve" else
            f"{run['prompts']} x") + f" {run['input_len']}/{run['output_len']}"


def winners(table: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per cell (folder and load), the measured and the predicted fastest runner."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        if row["runner"] not in STOCK_SCHEDULE_ONLY:
            by_cell.setdefault(f"{row['folder']} {_load(row)}", []).append(row)
    return {cell: (max(rs, key=lambda r: r["req_per_s"])["runner"],
                   max(rs, key=lambda r: r["predicted"])["runner"])
            for cell, rs in by_cell.items() if len(rs) > 1}


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| cell | workload | shape | runner | layout | load | measured req/s | "
             "predicted | error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        layout = f"TP={r['tp'] * r['pp']}" if r["runner"] == "tp" else f"PP={r['pp']}"
        lines.append(f"| {r['folder']} | {r['workload']} | {r['shape']} | {r['runner']} | "
                     f"{layout} | {_load(r)} | {r['req_per_s']:.2f} | {r['predicted']:.2f} | "
                     f"{r['error']:+.0%} |")
    errors = [abs(r["error"]) for r in table]
    right = winners(table)
    lines += ["", f"{len(table)} runs: median |error| {statistics.median(errors):.0%}, "
              f"worst {max(errors):.0%}; {sum(r <= 0.15 for r in errors)} within 15%. "
              f"Winner (plugin, stock MRV2, TP; V1 left out) right in "
              f"{sum(m == p for m, p in right.values())} of {len(right)} cells"
              + "".join(f"; {cell}: measured {m}, predicted {p}"
                        for cell, (m, p) in right.items() if m != p) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.plan_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path)
    args = parser.parse_args(argv)
    print(markdown(rows(json.loads(args.cells.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
