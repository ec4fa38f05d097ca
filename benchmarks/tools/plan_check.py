"""``plan``'s predictions against the cells measured with a GPU per stage.

Reads a list of measured runs (``cells.json``: one object per runner and cell, with
its workload, shape, layout, GPU, vLLM release, req/s and, where recorded, TPOT p50),
predicts each as ``vllm-pp-cudagraph plan`` would on that GPU and release (its rates,
stock PP's calibration), and prints a Markdown table of predicted against measured with
the errors; then, per cell, what the model alone would recommend under ``plan``'s rule
(the fastest predicted, or "too close to call" where the next is within the model's median
error) against the measured fastest. ``plan`` itself prints the measured winner for the
cells it ships (commands/planning/measured_cells.json); this checks the model without them.

    python -m benchmarks.tools.plan_check CELLS.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.planning.measured import error_class, row_error
from vllm_pp_cudagraph.commands.planning.pipeline_model import Prediction, layout_name
from vllm_pp_cudagraph.commands.planning.plan import predict_run

#: A recommended layout measured within this share of the fastest was level with it: no
#: committed cell's passes spread less (5-23% between passes of one server).
LEVEL = 0.02

#: Runners the model predicts with stock MRV2's schedule and cost though they are not
#: stock MRV2 (V1's runner has no term of its own): shown, left out of the winners.
STOCK_SCHEDULE_ONLY = frozenset({"v1"})


def predict(run: dict[str, Any]) -> Prediction | None:
    """The model's prediction for one measured run on its GPU and release
    (``predict_run``); None for a runner it does not model."""
    return predict_run(SHAPES[run["shape"]], run)


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        prediction = predict(run)
        if prediction is None or not run.get("req_per_s"):
            continue
        error = prediction.req_per_s / run["req_per_s"] - 1
        tpot, ttft = run.get("tpot_p50_ms"), run.get("ttft_p50_ms")
        predicted_ttft = None if prediction.ttft_s is None else prediction.ttft_s * 1e3
        out.append({**run, "predicted": prediction.req_per_s, "error": error,
                    "predicted_tpot_ms": prediction.tpot_s * 1e3,
                    "tpot_error": prediction.tpot_s * 1e3 / tpot - 1 if tpot else None,
                    "predicted_ttft_ms": predicted_ttft,
                    "ttft_error": (predicted_ttft / ttft - 1
                                   if ttft and predicted_ttft is not None else None),
                    "predicted_cadence": prediction.cadence,
                    "host_paced": prediction.host_paced})
    return out


def _load(run: dict[str, Any]) -> str:
    servers = run.get("api_servers") or 1
    return (f"c={run['concurrency']}" if run["workload"] == "serve" else
            f"{run['prompts']} x") + f" {run['input_len']}/{run['output_len']}" + (
            f", {servers} API servers" if servers > 1 else "")


def _cells(table: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        if row["runner"] not in STOCK_SCHEDULE_ONLY:
            by_cell.setdefault(f"{row['folder']} {_load(row)}", []).append(row)
    return by_cell


def _layouts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that stand for the layouts ``plan`` compares: the plugin's defaults (a
    fixed cadence only where the cell has no run of the defaults), stock PP and TP."""
    defaults = any(r["runner"] == "plugin" for r in rows)
    return [r for r in rows if not r["runner"].startswith("plugin-") or not defaults]


def _layout(row: dict[str, Any]) -> str:
    # The bench's TP runner spreads --pp x --tp GPUs over TP alone.
    if row["runner"] == "tp":
        return layout_name(1, row["tp"] * row["pp"])
    return layout_name(row["pp"], row["tp"])


def _named(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A cell's runs by runner, or by runner and layout where the cell measured a runner at
    more than one layout (the plugin at PP=4 and at TP=2 x PP=2 are two contenders)."""
    layouts: dict[str, set[str]] = {}
    for row in rows:
        layouts.setdefault(row["runner"], set()).add(_layout(row))
    named: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        mixed = len(layouts[row["runner"]]) > 1
        name = f"{row['runner']} {_layout(row)}" if mixed else row["runner"]
        named.setdefault(name, []).append(row)
    return named


def _mean(named: dict[str, list[dict[str, Any]]], key: str) -> dict[str, float]:
    """Each contender's mean ``key`` over its runs in one cell (a runner measured twice,
    as stock beside each plugin runner, counts once)."""
    return {name: statistics.fmean(r[key] for r in runs) for name, runs in named.items()}


def winners(table: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Per cell (folder and load), the measured and the predicted fastest runner."""
    out = {}
    for cell, rs in _cells(table).items():
        named = _named(rs)
        measured, predicted = _mean(named, "req_per_s"), _mean(named, "predicted")
        if len(measured) > 1:
            out[cell] = (max(measured, key=measured.get), max(predicted, key=predicted.get))
    return out


def decisions(table: list[dict[str, Any]], error: float | None = None) -> dict[str, dict]:
    """Per cell, what the model alone recommends under ``plan``'s rule (``error``: the
    error it allows; by default, as ``plan``, the larger of the two best layouts' median
    errors for the cell's workload, measured_cells.json's) and whether the measured
    fastest contradicts it: verdict ``right`` (the fastest, or within :data:`LEVEL` of
    it), ``too close`` or ``wrong``."""
    out = {}
    for cell, rs in _cells(table).items():
        named = _named(_layouts(rs))
        measured, predicted = _mean(named, "req_per_s"), _mean(named, "predicted")
        if len(measured) < 2:
            continue
        ranked = sorted(predicted, key=predicted.get, reverse=True)
        fastest = max(measured, key=measured.get)
        allowed = error if error is not None else max(
            row_error(kind(named[name][0]["runner"]), named[name][0]["workload"],
                      named[name][0]["host_paced"]) for name in ranked[:2])
        if predicted[ranked[1]] * (1 + allowed) > predicted[ranked[0]]:
            verdict, recommended = "too close", None
        else:
            recommended = ranked[0]
            level = measured[recommended] >= (1 - LEVEL) * measured[fastest]
            verdict = "right" if level else "wrong"
        out[cell] = {"verdict": verdict, "recommended": recommended, "measured": fastest}
    return out


def kind(runner: str) -> str:
    """The layout kind ``plan`` rows are: the plugin's PP, stock PP or TP."""
    return "plugin" if runner.startswith("plugin") else "tp" if runner == "tp" else "stock"


def errors_by_kind(table: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median |error| on req/s per layout kind and class (the workload, the rows the host
    paces apart: :func:`~vllm_pp_cudagraph.commands.planning.measured.error_class`), over the runs
    ``plan``'s rows stand for (V1 left out): what ``plan`` prints beside each prediction
    (commands/planning/measured_cells.json, ``errors``)."""
    errors: dict[str, dict[str, list[float]]] = {}
    for row in table:
        if row["runner"] in STOCK_SCHEDULE_ONLY:
            continue
        errors.setdefault(kind(row["runner"]), {}).setdefault(
            error_class(row["workload"], row["host_paced"]), []).append(abs(row["error"]))
    return {k: {w: round(statistics.median(v), 3) for w, v in sorted(by.items())}
            for k, by in sorted(errors.items())}


def _median_abs(values: list[float]) -> str:
    return f"{statistics.median(abs(v) for v in values):.0%}" if values else "-"


def markdown(table: list[dict[str, Any]], error: float | None = None) -> str:
    lines = ["| cell | workload | shape | GPU | vLLM | runner | layout | load | measured req/s | "
             "predicted | error | TPOT p50 ms, measured / predicted | "
             "TTFT p50 s, measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        layout = _layout(r)
        tpot = (f"{r['tpot_p50_ms']:.1f} / {r['predicted_tpot_ms']:.1f} ({r['tpot_error']:+.0%})"
                if r["tpot_error"] is not None else "-")
        ttft = (f"{r['ttft_p50_ms'] / 1e3:.2f} / {r['predicted_ttft_ms'] / 1e3:.2f} "
                f"({r['ttft_error']:+.0%})" if r.get("ttft_error") is not None else "-")
        gpu = (r.get("gpu") or "H200, assumed").replace("NVIDIA ", "")
        lines.append(f"| {r['folder']} | {r['workload']} | {r['shape']} | {gpu} | "
                     f"{r.get('vllm_version') or '-'} | {r['runner']} | {layout} | {_load(r)} | "
                     f"{r['req_per_s']:.2f} | {r['predicted']:.2f} | {r['error']:+.0%} | {tpot} | "
                     f"{ttft} |")
    errors = [abs(r["error"]) for r in table]
    right = winners(table)
    decided = decisions(table, error)
    counts = {v: sum(d["verdict"] == v for d in decided.values())
              for v in ("right", "too close", "wrong")}
    recommended_cells = {c for c, d in decided.items() if d["recommended"]}
    in_recommended = [r for c, rs in _cells(table).items() if c in recommended_cells
                      for r in _layouts(rs)]
    tpots = [r["tpot_error"] for r in table if r["tpot_error"] is not None]
    ttfts = [r["ttft_error"] for r in table if r.get("ttft_error") is not None]
    lines += ["", f"{len(table)} runs: median |error| {statistics.median(errors):.0%}, "
              f"worst {max(errors):.0%}; {sum(r <= 0.15 for r in errors)} within 15%. "
              f"TPOT p50: median |error| {_median_abs(tpots)} over the {len(tpots)} runs "
              f"that recorded it. TTFT p50: median |error| {_median_abs(ttfts)} over the "
              f"{len(ttfts)} served runs that recorded it. Fastest predicted (plugin, stock "
              f"MRV2, TP; V1 left out) is the measured fastest in "
              f"{sum(m == p for m, p in right.values())} of {len(right)} cells.",
              "", f"Under plan's rule ({'each pair of layouts its median error' if error is None else f'{error:.0%}'} "
              f"allowed): {counts['right']} cells recommended right, {counts['too close']} "
              f"too close to call, {counts['wrong']} wrong"
              + "".join(f"; {cell}: recommended {d['recommended']}, measured {d['measured']}"
                        for cell, d in decided.items() if d["verdict"] == "wrong")
              + f". Where a layout was recommended: median |error| "
              f"{_median_abs([r['error'] for r in in_recommended])} on req/s over "
              f"{len(in_recommended)} runs, "
              f"{_median_abs([r['tpot_error'] for r in in_recommended if r['tpot_error'] is not None])} "
              "on TPOT p50.",
              "", "Median |error| on req/s by layout and workload (what plan prints beside "
              "each row): " + "; ".join(f"{k} {w} {e:.0%}" for k, by in errors_by_kind(table).items()
                                        for w, e in by.items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tools.plan_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", type=Path)
    parser.add_argument("--write-errors", type=Path, metavar="MEASURED_CELLS_JSON",
                        help="also store the median error by layout kind and workload there "
                        "(src/vllm_pp_cudagraph/commands/planning/measured_cells.json), for plan")
    args = parser.parse_args(argv)
    table = rows(json.loads(args.cells.read_text()))
    print(markdown(table))
    if args.write_errors:
        shipped = json.loads(args.write_errors.read_text())
        shipped["errors"] = errors_by_kind(table)
        args.write_errors.write_text(json.dumps(shipped, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
