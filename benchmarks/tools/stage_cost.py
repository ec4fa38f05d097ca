"""What a PP=2 stage of a shape (or ``--layers`` of it) costs per decode step, run alone by stock
vLLM on one GPU with a whole model's embedding and head: the profile ``cost_table.py`` fits."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.arguments import positive_int_list
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.bench.engine_run import generate_as_one_batch, make_prompts
from vllm_pp_cudagraph.commands.bench.trace_analysis import Step, load_trace, steps, summarize
from vllm_pp_cudagraph.commands.planning.shapes import read_model_config

DEFAULT_BATCHES = (1, 32, 64, 128, 256)
PP = 2
SHORT_OUTPUT = 8  # output tokens of the short pass
STEPS = 64  # decode steps the long pass adds, timed per cell


def stage_config(shape: str, pp: int, layers: int | None = None,
                 model_dir: str | None = None) -> dict[str, Any]:
    """``shape``'s (or ``model_dir``'s) config with a stage's larger share of the layers."""
    if layers is not None and layers < 1:
        raise ValueError(f"--layers {layers}: must be at least 1")
    if model_dir is None and shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
    config = read_model_config(model_dir or shape)
    config["num_hidden_layers"] = layers or -(-config["num_hidden_layers"] // pp)
    return config


def decode_segments(all_steps: list[Step]) -> list[list[Step]]:
    """The runs of decode-only steps that follow a prefill: one per pass, in order."""
    segments: list[list[Step]] = []
    after_prefill = False
    for step in all_steps:
        if step.kind == "prefill":
            after_prefill = True
        elif step.decode_only:
            if after_prefill:
                segments.append([])
                after_prefill = False
            if segments:
                segments[-1].append(step)
    return segments


def _child(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.config import ProfilerConfig
    from vllm.inputs import TokensPrompt

    out = Path(args.out)
    model_dir = out / "model" / args.shape
    model_dir.mkdir(parents=True, exist_ok=True)
    config = stage_config(args.shape, PP, args.layers, args.model)
    (model_dir / "config.json").write_text(json.dumps(config, indent=1))
    traces = out / "traces" / args.shape
    shutil.rmtree(traces, ignore_errors=True)
    start = time.perf_counter()
    llm = LLM(
        model=str(model_dir), load_format="dummy", skip_tokenizer_init=True,
        max_num_seqs=max(args.batches), max_model_len=max(args.contexts) + SHORT_OUTPUT + STEPS + 8,
        gpu_memory_utilization=0.9, attention_backend="TRITON_ATTN",
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"}, seed=0,
        # After each cell's first pass its prompts are cached: the timed passes barely prefill.
        enable_prefix_caching=True,
        profiler_config=ProfilerConfig(profiler="torch", torch_profiler_dir=str(traces),
                                       torch_profiler_with_stack=False, ignore_frontend=True),
    )
    init_s = time.perf_counter() - start
    short = SamplingParams(temperature=0.0, max_tokens=SHORT_OUTPUT, ignore_eos=True)
    long = SamplingParams(temperature=0.0, max_tokens=SHORT_OUTPUT + STEPS, ignore_eos=True)
    cells = [(context, n) for context in args.contexts for n in args.batches]
    prompts = {cell: [TokensPrompt(prompt_token_ids=p)
                      for p in make_prompts(cell[1], cell[0], vocab=config["vocab_size"])]
               for cell in cells}

    def timed(cell: tuple[int, int], params) -> float:
        t0 = time.perf_counter()
        generate_as_one_batch(llm, prompts[cell], params)
        return time.perf_counter() - t0

    rows = []
    for cell in cells:
        timed(cell, long)  # warm-up
        short_s = min(timed(cell, short) for _ in range(2))
        long_s = min(timed(cell, long) for _ in range(2))
        rows.append({"context": cell[0], "batch": cell[1],
                     "step_ms": round(1e3 * (long_s - short_s) / STEPS, 3)})
    llm.start_profile()
    for cell in cells:
        generate_as_one_batch(llm, prompts[cell], long)
    llm.stop_profile()
    deadline = time.monotonic() + 120
    while not (files := sorted(traces.glob("*.pt.trace.json*"))) and time.monotonic() < deadline:
        time.sleep(2)  # the worker writes its trace as it stops
    time.sleep(5)
    if files:
        # The worker's trace is the one with the steps in it.
        segments = max((decode_segments(steps(load_trace(f))) for f in files), key=len)
        if len(segments) == len(cells):
            for row, segment in zip(rows, segments):
                summary = summarize(segment)
                row.update({key: summary.get(f"median_{key}") for key in
                            ("kernel_ms", "period_ms", "forward_ms", "generation_reqs",
                             "graph_launches", "kernel_launches")})
                row["gpu_busy_pct"] = summary.get("gpu_busy_pct")
        else:
            print(f"profiled pass: {len(segments)} decode runs for {len(cells)} cells; "
                  "profile left out", file=sys.stderr)
    shutil.rmtree(traces, ignore_errors=True)
    return {"shape": args.shape, "pp": PP, "layers": config["num_hidden_layers"],
            "init_s": round(init_s, 1), "steps": STEPS,
            "profiled_cells": sum("kernel_ms" in row for row in rows), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="qwen3-0.6b,qwen3-32b,llama-3.1-70b,qwen3-30b-a3b")
    parser.add_argument("--shape", help=argparse.SUPPRESS)  # one shape, in the child
    parser.add_argument("--layers", type=int, help="the stage's layers (instead of half)")
    parser.add_argument("--model", help="a model directory's config.json to run, not --shapes")
    parser.add_argument("--batches", type=positive_int_list("--batches"),
                        default=list(DEFAULT_BATCHES))
    parser.add_argument("--contexts", type=positive_int_list("--contexts"), default=[64, 1024],
                        help="prompt lengths (tokens)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per shape")
    args = parser.parse_args(argv)
    shapes = ([args.shape] if args.shape else [Path(args.model).name] if args.model
              else args.shapes.split(","))
    for shape in shapes:
        try:
            stage_config(shape, PP, args.layers, args.model)
        except ValueError as e:
            parser.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.shape:
        print(json.dumps(_child(args)), flush=True)
        return 0
    results, failed = [], []
    for shape in shapes:
        log = out / f"{shape}.log"
        cmd = [sys.executable, "-m", "benchmarks.tools.stage_cost", "--shape", shape,
               *(argv if argv is not None else sys.argv[1:])]
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=args.timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if line.startswith('{"shape"')]
        if rc == 0 and lines:
            results.append(json.loads(lines[-1]))
            print(f"{shape}: " + ", ".join(f"c{r['context']}/n{r['batch']} {r['step_ms']} ms"
                                            f" (GPU {r.get('kernel_ms')})" for r in results[-1]["rows"]),
                  flush=True)
        else:
            failed.append(shape)
            print(f"{shape}: failed ({rc}), see {log.name}", flush=True)
        (out / "stage_cost.json").write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
