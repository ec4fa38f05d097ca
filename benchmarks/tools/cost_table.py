"""Measure a model shape's cost table on one GPU: what ``VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto``
reads to split the layers over the stages.

Runs ``stage_cost.py`` (stock vLLM, PP=1, dummy weights, the whole model's embedding, LM
head and sampler) with two layer counts, and for each batch size fits the GPU time per
decode step as ``fixed + layers * per_layer`` (``kernel_ms`` where the profile has it,
else ``step_ms``). ``per_layer`` is a decoder layer's cost; ``fixed`` is the embedding's
plus the LM head's and the sampler's. The embedding (one row gathered per token) is too
small to measure apart: it keeps the bytes/FLOPs model's estimate, and the LM head
and sampler get the rest. The table lands in ``OUT/<signature>.json``; copied into
``src/vllm_pp_cudagraph/shared/cost_tables/`` it replaces the model for that shape.

    python -m benchmarks.tools.cost_table --out DIR (--shape qwen3-32b | --model DIR)
        [--layers 4,12] [--batches 1,32,64,128,256] [--context 64] [--tp N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.tools.stage_cost import DEFAULT_BATCHES, model_config
from vllm_pp_cudagraph.commands.bench.arguments import positive_int_list
from vllm_pp_cudagraph.commands.planning.pipeline_model import tp_shard_config
from vllm_pp_cudagraph.shared.stage_costs import ModelShape, modelled_costs

DEFAULT_LAYERS = (4, 12)
DEFAULT_CONTEXT = 64


def step_ms(row: dict[str, Any]) -> float:
    """A stage_cost row's GPU time per step: the profiled kernel time, else the wall time."""
    value = row.get("kernel_ms")
    return float(value if value is not None else row["step_ms"])


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``(fixed, per_layer)`` of ``ms = fixed + layers * per_layer``."""
    if len({layers for layers, _ in points}) < 2:
        raise ValueError("the fit needs runs at two layer counts or more")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points)
             / sum((x - mean_x) ** 2 for x, _ in points))
    return mean_y - slope * mean_x, slope


def fit_rows(runs: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per batch size from ``stage_cost.py`` results at several layer counts.

    Refuses a fit whose per-layer cost is not positive (a noisy run): rerun with
    layer counts further apart.
    """
    shape = ModelShape.from_config(config)
    points: dict[int, list[tuple[int, float]]] = {}
    for run in runs:
        for row in run["rows"]:
            points.setdefault(int(row["batch"]), []).append((int(run["layers"]), step_ms(row)))
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


def _measure(args: argparse.Namespace, layers: int) -> dict[str, Any]:
    out = Path(args.out) / f"layers-{layers}"
    cmd = [sys.executable, "-m", "benchmarks.tools.stage_cost", "--out", str(out),
           "--layers", str(layers), "--contexts", str(args.context),
           "--batches", ",".join(map(str, args.batches))]
    cmd += ["--model", args.model] if args.model else ["--shapes", args.shape]
    subprocess.run(cmd, check=True)
    (run,) = json.loads((out / "stage_cost.json").read_text())
    return run


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--shape", help="a built-in bench shape")
    source.add_argument("--model", help="a model directory (its config.json; dummy weights)")
    parser.add_argument("--layers", type=positive_int_list("--layers"),
                        default=list(DEFAULT_LAYERS), help="layer counts to fit (two or more)")
    parser.add_argument("--batches", type=positive_int_list("--batches"),
                        default=list(DEFAULT_BATCHES))
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                        help="prompt length of each request (tokens)")
    parser.add_argument("--tp", type=int, default=1,
                        help="measure one rank's shard of a TP=N engine instead (heads, KV "
                        "heads, intermediate and vocabulary over N, run as a model of its "
                        "own on one GPU, all-reduces left out): the table plan reads for TP")
    args = parser.parse_args(argv)
    try:
        config = model_config(args.shape, args.model)
    except ValueError as exc:
        parser.error(str(exc))
    if args.tp < 1:
        parser.error("--tp: must be at least 1")
    if args.tp > 1:
        config = tp_shard_config(config, args.tp)
        shard_dir = Path(args.out) / f"tp{args.tp}-shard"
        shard_dir.mkdir(parents=True, exist_ok=True)
        (shard_dir / "config.json").write_text(json.dumps(config, indent=1))
        args.model, args.shape = str(shard_dir), None
    if len(set(args.layers)) < 2:
        parser.error("--layers: give two layer counts or more")
    import vllm

    runs = [_measure(args, layers) for layers in sorted(set(args.layers))]
    measured = {"device": _device(), "vllm": vllm.__version__, "context": args.context,
                "layers": sorted(set(args.layers)), "tool": "benchmarks/tools/cost_table.py"}
    table = cost_table(config, runs, measured)
    path = Path(args.out) / f"{table['signature']}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path}: " + ", ".join(f"n{r['batch']}: layer {r['layer_ms']} ms, head "
                                   f"{r['lm_head_ms']} ms" for r in table["batches"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
