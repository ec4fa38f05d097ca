"""``plan``'s model against the cells measured with a GPU per stage (CELLS.json): each run
predicted on its GPU and release, the errors, and what the model alone would recommend."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.planning.measured import error_class, row_error
from vllm_pp_cudagraph.commands.planning.pipeline_model import layout_name
from vllm_pp_cudagraph.commands.planning.plan import predict_run

#: A recommended layout measured within this share of the fastest was level with it.
LEVEL = 0.02

#: Runners predicted as stock MRV2 though they are not: shown, left out of the winners.
STOCK_SCHEDULE_ONLY = frozenset({"v1"})


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        prediction = predict_run(SHAPES[run["shape"]], run)
        if prediction is None or not run.get("req_per_s"):
            continue
        tpot, ttft = run.get("tpot_p50_ms"), run.get("ttft_p50_ms")
        predicted_ttft = None if prediction.ttft_s is None else prediction.ttft_s * 1e3
        out.append({**run, "predicted": prediction.req_per_s,
                    "error": prediction.req_per_s / run["req_per_s"] - 1,
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
    """The runs standing for ``plan``'s layouts: the plugin's defaults (else its fixed cadences)."""
    defaults = any(r["runner"] == "plugin" for r in rows)
    return [r for r in rows if not r["runner"].startswith("plugin-") or not defaults]


def _layout(row: dict[str, Any]) -> str:
    if row["runner"] == "tp":  # the bench's TP runner spreads --pp x --tp GPUs over TP alone
        return layout_name(1, row["tp"] * row["pp"])
    return layout_name(row["pp"], row["tp"])


def _named(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A cell's runs by runner, or by runner and layout for a runner measured at two layouts."""
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
    """Each contender's mean ``key`` over its runs in a cell (a runner run twice counts once)."""
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
    """Per cell, the model's recommendation under ``plan``'s rule (allowing ``error``, by default
    the two best layouts' larger median error), verdict ``right``, ``too close`` or ``wrong``."""
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
    """Median |error| on req/s per layout kind and ``error_class``: what ``plan`` prints."""
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


def markdown(table: list[dict[str, Any]]) -> str:
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
    decided = decisions(table)
    counts = Counter(d["verdict"] for d in decided.values())
    in_recommended = [r for c, rs in _cells(table).items()
                      if c in decided and decided[c]["recommended"] for r in _layouts(rs)]
    tpots = [r["tpot_error"] for r in table if r["tpot_error"] is not None]
    ttfts = [r["ttft_error"] for r in table if r.get("ttft_error") is not None]
    lines += ["", f"{len(table)} runs: median |error| {statistics.median(errors):.0%}, "
              f"worst {max(errors):.0%}; {sum(r <= 0.15 for r in errors)} within 15%. "
              f"TPOT p50: median |error| {_median_abs(tpots)} over the {len(tpots)} runs "
              f"that recorded it. TTFT p50: median |error| {_median_abs(ttfts)} over the "
              f"{len(ttfts)} served runs that recorded it. Fastest predicted (plugin, stock "
              f"MRV2, TP; V1 left out) is the measured fastest in "
              f"{sum(m == p for m, p in right.values())} of {len(right)} cells.",
              "", "Under plan's rule (each pair of layouts its median error allowed): "
              f"{counts['right']} cells recommended right, {counts['too close']} "
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("cells", type=Path)
    parser.add_argument("--write-errors", type=Path, metavar="MEASURED_CELLS_JSON",
                        help="also store the median errors there, for plan")
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
