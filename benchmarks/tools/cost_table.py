"""A built-in shape's cost table, as ``VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto`` and ``plan`` read
it: ``stage_cost.py`` on one GPU at two layer counts, fitted as ``fixed + layers * per_layer``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.tools.stage_cost import DEFAULT_BATCHES
from vllm_pp_cudagraph.commands.bench.arguments import positive_int_list
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.planning.pipeline_model import tp_shard_config
from vllm_pp_cudagraph.shared.stage_costs import ModelShape, modelled_costs

CONTEXT = 64  # prompt length of each request (tokens)


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``y = intercept + x * slope`` over (x, y) points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return mean_y - slope * mean_x, slope


def fit_rows(runs: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per batch from ``stage_cost.py`` runs at several layer counts (GPU time, else wall)."""
    shape = ModelShape.from_config(config)
    points: dict[int, list[tuple[int, float]]] = {}
    for run in runs:
        for row in run["rows"]:
            ms = row["step_ms"] if row.get("kernel_ms") is None else row["kernel_ms"]
            points.setdefault(int(row["batch"]), []).append((int(run["layers"]), float(ms)))
    rows = []
    for batch in sorted(points):
        fixed, per_layer = fit_line(points[batch])
        if per_layer <= 0:
            raise ValueError(f"batch {batch}: a layer fits as {per_layer:.4f} ms; the runs "
                             "are too noisy (use layer counts further apart)")
        embedding = 1e3 * modelled_costs(shape, batch).embedding_s
        rows.append({"batch": batch, "layer_ms": round(per_layer, 5),
                     "embedding_ms": round(embedding, 5),
                     "lm_head_ms": round(max(fixed - embedding, 0.0), 5)})
    return rows


def cost_table(config: dict[str, Any], runs: list[dict[str, Any]],
               measured: dict[str, Any]) -> dict[str, Any]:
    """The cost table ``stage_costs.read_table`` reads, for the model of ``config``."""
    shape = ModelShape.from_config(config)
    return {"signature": shape.signature(), "shape": asdict(shape),
            "measured": measured, "batches": fit_rows(runs, config)}


def _measure(args: argparse.Namespace, layers: int, source: list[str]) -> dict[str, Any]:
    out = Path(args.out) / f"layers-{layers}"
    cmd = [sys.executable, "-m", "benchmarks.tools.stage_cost", "--out", str(out), *source,
           "--layers", str(layers), "--contexts", str(CONTEXT),
           "--batches", ",".join(map(str, args.batches))]
    subprocess.run(cmd, check=True)
    (run,) = json.loads((out / "stage_cost.json").read_text())
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES), help="a bench shape")
    parser.add_argument("--layers", type=positive_int_list("--layers"),
                        default=[4, 12], help="layer counts to fit (two or more)")
    parser.add_argument("--batches", type=positive_int_list("--batches"),
                        default=list(DEFAULT_BATCHES))
    parser.add_argument("--tp", type=int, default=1, help="measure one rank's shard of a "
                        "TP=N engine instead (all-reduces left out), the table plan reads for TP")
    args = parser.parse_args(argv)
    if args.tp < 1:
        parser.error("--tp: must be at least 1")
    config, source = dict(SHAPES[args.shape]), ["--shapes", args.shape]
    if args.tp > 1:
        config = tp_shard_config(config, args.tp)
        shard_dir = Path(args.out) / f"tp{args.tp}-shard"
        shard_dir.mkdir(parents=True, exist_ok=True)
        (shard_dir / "config.json").write_text(json.dumps(config, indent=1))
        source = ["--model", str(shard_dir)]
    if len(set(args.layers)) < 2:
        parser.error("--layers: give two layer counts or more")
    import torch
    import vllm

    runs = [_measure(args, layers, source) for layers in sorted(set(args.layers))]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown"
    measured = {"device": device, "vllm": vllm.__version__, "context": CONTEXT,
                "layers": sorted(set(args.layers)), "tool": "benchmarks/tools/cost_table.py"}
    table = cost_table(config, runs, measured)
    path = Path(args.out) / f"{table['signature']}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path}: " + ", ".join(f"n{r['batch']}: layer {r['layer_ms']} ms, head "
                                   f"{r['lm_head_ms']} ms" for r in table["batches"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
