"""``vllm-pp-cudagraph bench``: throughput and latency per CUDA-graph mode at PP.

Every mode runs in its own engine, one after another, in one invocation, so
ratios between modes are measured on the same machine state. Each engine
warms up on the exact workload (the first pass JIT-compiles kernels), then
runs it ``--repeat`` times; the median run is reported. Greedy outputs are
digested, and modes that must produce the same tokens are checked to do so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.bench.dummy_model import (
    SHAPES,
    has_random_weights,
    token_word,
    write_model_dir,
)
from vllm_pp_cudagraph.bench.interconnect import INTERCONNECTS, SIMULATES
from vllm_pp_cudagraph.bench.engine_run import (
    INTERNAL_RUNNERS,
    MODES,
    RUNNERS,
    TENSOR_PARALLEL_RUNNERS,
    TOKEN_FAMILY,
    RunSpec,
    make_prompts,
    run_in_subprocess,
    runner_cadence,
    runner_layout,
)
from vllm_pp_cudagraph.bench.serve_load import LoadSpec
from vllm_pp_cudagraph.bench.serve_run import run_serve_mode, run_vllm_bench_sweep
from vllm_pp_cudagraph.bench.token_judge import NEAR_TIE_NATS, TOP_LOGPROBS, TokenRecord, judge
from vllm_pp_cudagraph.exit_status import (
    EXIT_FAILED,
    EXIT_NO_GPU,
    EXIT_OK,
    TABLE,
    ArgumentParser,
)
from vllm_pp_cudagraph.layer_partition import vllm_split

DEFAULT_MODES = [
    f"{runner}:{mode}"
    for mode in ("eager", "piecewise", "full_and_piecewise", "full_decode_only", "breakable")
    for runner in ("plugin", "stock")
] + ["v1:full_and_piecewise"]

COLUMNS = [
    ("run", "run", "{}"),
    ("req_per_s", "req/s", "{:.2f}"),
    ("spread_pct", "spread %", "{:.0f}"),
    ("output_tok_per_s", "out tok/s", "{:.0f}"),
    ("ttft_mean_ms", "TTFT ms", "{:.1f}"),
    ("ttft_p99_ms", "TTFT p99", "{:.1f}"),
    ("tpot_mean_ms", "TPOT ms", "{:.2f}"),
    ("tpot_p50_ms", "TPOT p50", "{:.2f}"),
    ("tpot_p99_ms", "TPOT p99", "{:.2f}"),
    ("gpu_busy_pct", "GPU busy % per stage", "{}"),
    ("itl_p99_ms", "ITL p99", "{:.2f}"),
    ("init_s", "init s", "{:.0f}"),
    ("capture_s", "capture s", "{:.0f}"),
    ("graph_gib", "graphs GiB", "{:.2f}"),
    ("digest", "tokens", "{}"),
    ("tokens_verdict", "vs reference", "{}"),
]


def parse_modes(text: str) -> list[tuple[str, str, float | None]]:
    """``"plugin:piecewise,v1:full_and_piecewise@0.92"`` -> (runner, mode, utilization).

    The optional ``@UTIL`` overrides ``--gpu-memory-utilization`` for that run.
    """
    runs = []
    for item in text.split(","):
        spec, _, util_text = item.strip().partition("@")
        runner, _, mode = spec.partition(":")
        try:
            utilization = float(util_text) if util_text else None
        except ValueError:
            utilization = -1.0
        if runner not in RUNNERS or mode not in MODES or (
            utilization is not None and not 0 < utilization <= 1
        ):
            raise argparse.ArgumentTypeError(
                f"bad mode {item!r}: use RUNNER:MODE[@UTIL] with RUNNER in "
                f"{sorted(RUNNERS)}, MODE in {sorted(MODES)}, UTIL in (0, 1]"
            )
        runs.append((runner, mode, utilization))
    return runs


def family(report: dict[str, Any]) -> str:
    return TOKEN_FAMILY[report["spec"]["mode"]]


def check_agreement(reports: list[dict[str, Any]], near_tie_nats: float = NEAR_TIE_NATS) -> None:
    """Set ``tokens_agree`` and ``tokens_verdict`` on each report against its reference.

    A run's reference is the first stock-V2 run of the same mode when there is
    one (a second stock run of that mode is then the control: stock against
    itself). Otherwise it is its token family's first stock-V2 run, else the
    family's first run (a pipelined one before a ``tp`` one). Runs without a
    digest (failed) get None.

    ``tokens_agree``: the same digest as the reference, and every timed pass
    repeating the warm-up's (``repeats_itself``; with batches formed alike an
    engine must repeat itself). ``tokens_verdict``: "identical" where they
    agree; else, where both runs recorded logprobs, "near-ties" when every
    differing request parted from the reference's tokens at a near tie
    (:mod:`.token_judge`; ``divergence`` holds the details), "differ" otherwise.
    ``reference_layout_differs`` marks a reference of another (pp, tp) layout:
    tensor parallelism sums in another order, so its tokens may differ with
    nothing wrong.
    """
    ok = [r for r in reports if r.get("digest")]
    same_mode: dict[str, dict[str, Any]] = {}
    for report in ok:
        if report["spec"]["runner"] == "stock":
            same_mode.setdefault(report["spec"]["mode"], report)
    in_family: dict[str, dict[str, Any]] = {}
    for report in sorted(ok, key=lambda r: (r["spec"]["runner"] != "stock",
                                            r["spec"]["runner"] in TENSOR_PARALLEL_RUNNERS)):
        in_family.setdefault(family(report), report)
    for report in reports:
        ref = same_mode.get(report["spec"]["mode"]) or in_family.get(family(report))
        if not report.get("digest") or ref is None:
            report["tokens_agree"] = report["tokens_verdict"] = None
            continue
        passes = report.get("run_digests") or []
        report["repeats_itself"] = all(d == report["digest"] for d in passes)
        report["tokens_agree"] = report["repeats_itself"] and report["digest"] == ref["digest"]
        report["tokens_reference"] = f"{ref['spec']['runner']}:{ref['spec']['mode']}"
        report["reference_layout_differs"] = layout(report) != layout(ref)
        report["stock_control"] = (report is not ref and report["spec"]["runner"] == "stock"
                                   and ref["spec"]["mode"] == report["spec"]["mode"])
        mine, theirs = report.get("request_digests"), ref.get("request_digests")
        if mine and theirs and len(mine) == len(theirs):
            report["requests_differ"] = sum(a != b for a, b in zip(mine, theirs))
        report["tokens_verdict"] = token_verdict(report, ref, near_tie_nats)


def token_verdict(report: dict[str, Any], ref: dict[str, Any], near_tie_nats: float) -> str:
    """"identical", "near-ties" or "differ" (see :func:`check_agreement`)."""
    if report["tokens_agree"]:
        return "identical"
    if not report["repeats_itself"]:
        return "differ"
    files = [r["spec"].get("tokens_file") for r in (report, ref)]
    if not all(files) or not all(Path(f).is_file() for f in files):
        return "differ"
    report["divergence"] = judge(*(TokenRecord.load(Path(f)) for f in files), near_tie_nats)
    return report["divergence"]["verdict"]


def layout(report: dict[str, Any]) -> tuple[int, int]:
    """(pipeline, tensor) parallel sizes a run's engine ran at."""
    return report["spec"].get("pp", 0), report["spec"].get("tp", 1)


def layout_label(spec: dict[str, Any]) -> str:
    """`` [TP 2]`` or `` [PP 2 x TP 2]`` for runs with tensor parallelism; else nothing."""
    pp, tp = spec.get("pp", 0), spec.get("tp", 1)
    if tp == 1:
        return ""
    return f" [TP {tp}]" if pp == 1 else f" [PP {pp} x TP {tp}]"


def layout_text(report: dict[str, Any]) -> str:
    pp, tp = layout(report)
    return f"PP {pp} x TP {tp}"


def across_engines(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each run given more than once: the median req/s over its engines.

    One engine's timed passes vary less than separate engines of the same run
    do (start-up, NCCL set-up, clocks), so comparing runners closely means
    starting each several times, interleaved, and comparing these medians.
    """
    by_run: dict[str, list[float]] = {}
    for report in reports:
        if report.get("digest") and report.get("req_per_s") is not None:
            spec = report["spec"]
            name = f"{spec['runner']}:{spec['mode']}@{spec['gpu_memory_utilization']}"
            by_run.setdefault(name, []).append(report["req_per_s"])
    return [
        {
            "run": name,
            "engines": len(values),
            "median_req_per_s": round(statistics.median(values), 2),
            "min_req_per_s": min(values),
            "max_req_per_s": max(values),
        }
        for name, values in by_run.items()
        if len(values) > 1
    ]


def _cell(report: dict[str, Any], key: str, fmt: str) -> str:
    if key == "run":
        value = f"{report['spec']['runner']}:{report['spec']['mode']}{layout_label(report['spec'])}"
        if "concurrency" in report:
            value += f" c={report['concurrency']}"
            if report.get("input_len") not in (None, report["spec"]["input_len"]):
                value += f" in={report['input_len']}"
        if report["spec"].get("interconnect", "nvlink") != "nvlink":
            value += f" [{report['spec']['interconnect']}]"
    else:
        value = report.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "FAILED" if key == "req_per_s" else "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, list):
        return "/".join(f"{v:.0f}" for v in value)
    return fmt.format(value)


def render_table(reports: list[dict[str, Any]]) -> str:
    header = [title for _, title, _ in COLUMNS]
    rows = [[_cell(r, key, fmt) for key, _, fmt in COLUMNS] for r in reports]
    widths = [max(len(x) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def write_plot(reports: list[dict[str, Any]], path: Path) -> bool:
    """Throughput and TPOT per mode, plugin next to stock. Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: matplotlib is not installed; skipping the plot (pip install matplotlib)")
        return False
    modes = list(dict.fromkeys(r["spec"]["mode"] for r in reports))
    runners = list(dict.fromkeys(r["spec"]["runner"] for r in reports))
    by_key = {(r["spec"]["runner"], r["spec"]["mode"]): r for r in reports}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / max(len(runners), 1)
    for ax, key, title in ((axes[0], "req_per_s", "throughput (req/s, higher is better)"),
                           (axes[1], "tpot_mean_ms", "TPOT (ms, lower is better)")):
        for i, runner in enumerate(runners):
            values = [by_key.get((runner, m), {}).get(key) or 0 for m in modes]
            xs = [j + i * width for j in range(len(modes))]
            ax.bar(xs, values, width, label=runner)
        ax.set_xticks([j + width * (len(runners) - 1) / 2 for j in range(len(modes))])
        ax.set_xticklabels(modes, rotation=20)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def positive_int_list(flag: str):
    """An argparse type for ``flag``: ``N`` or ``N,M,...``, each at least 1."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"bad {flag} {text!r}: use N or N,M,...")
        return values
    return parse


def serve_points(text: str) -> list[tuple[int, int]]:
    """``--points``: ``IN:C,...``, each an input length and a concurrency of at least 1."""
    try:
        points = [tuple(int(v) for v in item.split(":")) for item in text.split(",")]
    except ValueError:
        points = []
    if not points or any(len(p) != 2 or min(p) < 1 for p in points):
        raise argparse.ArgumentTypeError(
            f"bad --points {text!r}: use INPUT_LEN:CONCURRENCY,..., e.g. 64:256,1024:256")
    return points  # type: ignore[return-value]


def asked_backend(name: str) -> str | None:
    """``--attention-backend`` as vLLM takes it: None for vLLM's own choice."""
    return None if name.lower() in ("", "auto") else name


def json_object_with(flag: str, key: str, example: str) -> Callable[[str], dict[str, Any]]:
    """An argparse type: ``flag`` as a JSON object holding ``key``."""

    def parse(text: str) -> dict[str, Any]:
        try:
            config = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict) or key not in config:
            raise argparse.ArgumentTypeError(
                f'bad {flag} {text!r}: use a JSON object with a "{key}", e.g. {example}')
        return config

    return parse


speculative_config = json_object_with(
    "--speculative-config", "method", '{"method": "ngram", "num_speculative_tokens": 3}')
kv_transfer_config = json_object_with(
    "--kv-transfer-config", "kv_connector",
    '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}')


def run_spec(args: argparse.Namespace, runner: str, mode: str, utilization: float | None,
             shape: str, model: str | None, log_name: str) -> RunSpec:
    """One run of the invocation ``args``: ``runner`` in ``mode`` at its engine layout."""
    pp, tp = runner_layout(runner, args.pp, args.tp)
    return RunSpec(
        runner=runner,
        mode=mode,
        pp=pp,
        tp=tp,
        layer_partition=args.layer_partition if pp == args.pp else None,
        speculative_config=args.speculative_config,
        kv_transfer_config=args.kv_transfer_config,
        async_scheduling=False if args.no_async_scheduling else None,
        max_model_len=args.max_model_len,
        deterministic_compile=args.deterministic_compile,
        prompts=args.prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        output_len_spread=args.output_len_spread,
        max_num_seqs=args.max_num_seqs,
        workload=args.workload,
        repeat=args.repeat,
        shape=shape,
        model=model,
        weights=args.weights,
        attention_backend=asked_backend(args.attention_backend),
        gpu_memory_utilization=utilization or args.gpu_memory_utilization,
        profile_dir=str((args.out / "traces" / log_name).resolve()) if args.profile else None,
        interconnect=args.interconnect,
        executor=args.executor,
        **token_record_options(args, log_name),
    )


def token_record_options(args: argparse.Namespace, log_name: str) -> dict[str, Any]:
    """Batch runs record their tokens and top logprobs in OUT/NAME.tokens.json, for the judge."""
    if args.workload != "batch" or args.serve:
        return {}
    return {"logprobs": TOP_LOGPROBS, "tokens_file": str(args.out / f"{log_name}.tokens.json")}


def serve_load_spec(args: argparse.Namespace) -> LoadSpec:
    """Streamed greedy completions over the benchmark's prompts, as text."""
    prompts = [" ".join(map(token_word, ids)) for ids in make_prompts(args.prompts, args.input_len)]
    return LoadSpec(
        base_url="",
        model="",
        prompts=prompts,
        num_requests=args.num_requests or args.prompts,
        concurrency=args.concurrency[0],
        max_tokens=args.output_len,
        stream_fraction=1.0,
        cancel_fraction=0.0,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="vllm-pp-cudagraph bench",
        description=__doc__.split("\n\n")[0]
        + " Needs at least --pp x --tp NVIDIA GPUs; refuses at once with fewer. " + TABLE,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for add_options in (add_engine_options, add_workload_options, add_result_options,
                        add_serving_options):
        add_options(parser)
    return parser


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """The model, its engine layout and vLLM's settings."""
    group = parser.add_argument_group("model and engine, the same for every run")
    group.add_argument(
        "--model",
        default="qwen3-0.6b",
        help=f"a model directory, or a built-in shape (no download, see --weights): {sorted(SHAPES)}",
    )
    group.add_argument(
        "--weights",
        choices=("random", "dummy"),
        default="random",
        help="for a built-in shape: 'random' writes a seeded random checkpoint, so greedy "
        "outputs depend on every layer and the token checks mean something; 'dummy' uses "
        "vLLM's dummy loader (starts faster; its tiny weights make outputs nearly "
        "independent of the layers, so use it for speed only)",
    )
    group.add_argument("--pp", type=int, default=2,
                       help="pipeline-parallel size (stages, each on --tp GPUs; 1: no pipeline)")
    group.add_argument("--tp", type=int, default=1,
                       help="tensor-parallel size inside each pipeline stage; the runs need "
                       "--pp x --tp GPUs")
    group.add_argument(
        "--layer-partition", type=positive_int_list("--layer-partition"), default=None,
        help="layers per pipeline stage, --pp of them, e.g. 8,7,7,6 (vLLM's "
        "VLLM_PP_LAYER_PARTITION); None: vLLM's split")
    group.add_argument(
        "--attention-backend", default="auto",
        help="vLLM attention backend for every run, e.g. TRITON_ATTN, FLASH_ATTN, FLASHINFER; "
        "'auto' passes none, leaving the choice to vLLM (bench.json records the one asked "
        "for, null for vLLM's choice, and the one vLLM logged as attention_backend_used)")
    group.add_argument(
        "--interconnect", choices=INTERCONNECTS, default="nvlink",
        help="the link between GPUs simulated for every run: "
        + "; ".join(f"{k}: {v}" for k, v in SIMULATES.items())
        + ". host and socket also turn off custom, symmetric-memory and FlashInfer "
        "all-reduce for every runner alike, so all traffic between GPUs goes through NCCL")
    group.add_argument(
        "--executor", choices=("mp", "ray"), default=None,
        help="vLLM's distributed_executor_backend for every run; 'ray' places the stages on "
        "the Ray cluster RAY_ADDRESS names (benchmarks/gpu_kit/ray_nodes.sh starts one "
        "node per GPU on one host); unset, vLLM's choice")
    group.add_argument(
        "--speculative-config", type=speculative_config, default=None,
        help='vLLM\'s speculative_config for every run, a JSON object with a "method", e.g. '
        '\'{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}\'; '
        "bench.json records the acceptance vLLM counted (engine workloads)")
    group.add_argument(
        "--kv-transfer-config", type=kv_transfer_config, default=None,
        help='vLLM\'s kv_transfer_config for every run, a JSON object with a "kv_connector", '
        'e.g. \'{"kv_connector": "ExampleConnector", "kv_role": "kv_both", '
        '"kv_connector_extra_config": {"shared_storage_path": "DIR"}}\'')
    group.add_argument(
        "--no-async-scheduling", action="store_true",
        help="turn vLLM's async scheduling off for every run; unset, vLLM chooses")
    group.add_argument("--max-model-len", type=int, default=None,
                       help="vLLM's max_model_len for every run; unset, the model's")
    group.add_argument(
        "--deterministic-compile", action="store_true",
        help="compile with Inductor's deterministic mode (kernels chosen without timing "
        "them), so engines built alike run the same kernels: token checks compare like "
        "with like. Slower kernels: not for speed runs")
    group.add_argument("--max-num-seqs", type=int, default=128,
                       help="vLLM's max_num_seqs: requests batched at once")
    group.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                       help="vLLM's gpu_memory_utilization for every run")


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """What each engine is given to do, and which engines run."""
    group = parser.add_argument_group("workload and runs")
    group.add_argument(
        "--workload", choices=("batch", "engine", "serve"), default="batch",
        help="batch: requests queued with the scheduler paused, one batch (tokens compared "
        "across runners); engine: LLM.generate as users call it, requests arriving while "
        "the engine steps (tokens not compared: vLLM is not batch-invariant); serve: "
        "vllm serve driven by vLLM's own 'vllm bench serve' client, random dataset, one "
        "run per --concurrency")
    group.add_argument(
        "--modes",
        type=parse_modes,
        default=",".join(DEFAULT_MODES),
        help="comma list of RUNNER:MODE[@UTIL], RUNNER in "
        f"{sorted(set(RUNNERS) - INTERNAL_RUNNERS)}, MODE in "
        f"{sorted(MODES)}, UTIL a per-run --gpu-memory-utilization; runner 'tp' is stock "
        "vLLM on the same GPUs by tensor parallelism alone (tensor_parallel_size --pp x "
        "--tp, no pipeline, no plugin); 'plugin-auto-split' is the plugin with "
        "VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto, and bench.json's layer_partition_used the "
        "split its engine logged (give stock the same with --layer-partition)",
    )
    group.add_argument("--prompts", "--num-prompts", dest="prompts", type=int, default=128,
                       help="requests per timed run")
    group.add_argument("--input-len", type=int, default=2, help="prompt length in tokens")
    group.add_argument("--output-len", type=int, default=512,
                       help="tokens generated per request (greedy, EOS ignored)")
    group.add_argument(
        "--output-len-spread",
        type=int,
        default=0,
        help="requests ask for up to this many tokens fewer than --output-len; with more "
        "--prompts than --max-num-seqs, prefills then share batches with decodes",
    )
    group.add_argument("--repeat", type=int, default=3, help="timed runs after warm-up")
    group.add_argument(
        "--near-tie-nats", type=float, default=NEAR_TIE_NATS,
        help="batch: where two runs' tokens differ, each request's first divergence counts "
        "as rounding if each run's token lies within this many nats of the other run's top "
        "choice there (their logprobs are recorded). Set for the built-in shapes' random "
        "weights; a real checkpoint's larger logits round in larger steps (a bfloat16 step "
        "is 0.125 between 16 and 32), so raise it there and keep stock's control in the run")


def add_result_options(parser: argparse.ArgumentParser) -> None:
    """Time limits, profiling and where results go."""
    group = parser.add_argument_group("time and results")
    group.add_argument("--timeout", type=float, default=900, help="seconds per engine")
    group.add_argument(
        "--deadline", type=float, default=None, help="seconds for all engines; later ones are skipped"
    )
    group.add_argument("--out", type=Path, default=Path("bench-results"),
                       help="directory for bench.json (rewritten as each run ends), the "
                       "table, logs and the model")
    group.add_argument(
        "--profile",
        action="store_true",
        help="after the timed runs, profile one more pass per engine (for --workload serve: "
        "per concurrency, through vLLM's /start_profile and /stop_profile) with "
        "torch.profiler and report each rank's median decode step: time in and outside "
        "the forward, GPU busy %%, kernel time, launches, host syncs, NCCL time (traces "
        "under OUT/traces/)",
    )


def add_serving_options(parser: argparse.ArgumentParser) -> None:
    """The server and its client (--serve, --workload serve)."""
    group = parser.add_argument_group("serving (--serve, --workload serve)")
    group.add_argument(
        "--serve",
        action="store_true",
        help="measure through 'vllm serve' with an OpenAI-compatible client instead "
        "of the offline engine (TTFT/TPOT as users see them; streamed requests)",
    )
    group.add_argument("--concurrency", type=positive_int_list("--concurrency"), default="64",
                       help="requests in flight at once; for --workload serve a comma "
                       "list, one run each (a sweep)")
    group.add_argument("--points", type=serve_points, default=None,
                       help="--workload serve: comma list of INPUT_LEN:CONCURRENCY, each a "
                       "sweep point on the same server (instead of --input-len with each "
                       "--concurrency)")
    group.add_argument("--num-requests", type=int, default=None,
                       help="requests per timed run (None: --prompts); --workload serve "
                       "sends at least two per request in flight")
    group.add_argument("--port", type=int, default=8000, help="port of the server")


def engine_status(report: dict[str, Any], log_name: str) -> str:
    """One console line for an engine: its speed, or why it gave none."""
    if report.get("digest"):
        tpot = report.get("tpot_mean_ms") or report.get("tpot_p50_ms")
        tpot = tpot if tpot is None else round(tpot, 2)
        return f"{report['req_per_s']:.2f} req/s, TPOT {tpot} ms"
    if "timed_out_after_s" in report:
        return (
            f"STOPPED after {report['timed_out_after_s']:.0f} s, its time limit "
            f"(--timeout, shortened by --deadline); see {log_name}.log"
        )
    return f"FAILED (rc={report['returncode']}, see {log_name}.log)"


#: The fewest pipeline stages the bench suggests where GPUs are short (one GPU each).
MIN_PP = 2
#: Integer options and the least value a run can use.
AT_LEAST = (
    ("pp", "--pp", 1, "1 runs without a pipeline, where the plugin must change nothing"),
    ("tp", "--tp", 1, ""),
    ("prompts", "--prompts", 1, ""),
    ("input_len", "--input-len", 1, ""),
    ("output_len", "--output-len", 1, ""),
    ("max_num_seqs", "--max-num-seqs", 1, ""),
    ("repeat", "--repeat", 0, "0 keeps the warm-up pass only"),
)
#: Seconds an engine needs at the least; --deadline skips those left less.
MIN_ENGINE_S = 60


def argument_problems(args: argparse.Namespace) -> list[str]:
    """What no run can do in ``args``, one message per flag (checked before anything starts)."""
    problems = []
    for dest, flag, least, why in AT_LEAST:
        value = getattr(args, dest)
        if value < least:
            problems.append(f"{flag} {value} must be at least {least}" + (f" ({why})" if why else ""))
    if args.output_len >= 1 and not 0 <= args.output_len_spread < args.output_len:
        problems.append(f"--output-len-spread={args.output_len_spread} must be at least 0 and "
                        f"below --output-len={args.output_len}")
    if args.points and args.workload != "serve":
        problems.append("--points is for --workload serve (a sweep on one server)")
    if args.num_requests is not None and args.num_requests < 1:
        problems.append(f"--num-requests {args.num_requests} must be at least 1")
    if not 0 < args.gpu_memory_utilization <= 1:
        problems.append(f"--gpu-memory-utilization {args.gpu_memory_utilization} must be in (0, 1]")
    if args.near_tie_nats < 0:
        problems.append(f"--near-tie-nats {args.near_tie_nats} must be at least 0")
    if args.timeout <= 0:
        problems.append(f"--timeout {args.timeout} must be positive (seconds per engine)")
    if args.deadline is not None and args.deadline < MIN_ENGINE_S:
        problems.append(f"--deadline {args.deadline} leaves no engine time to run: each one "
                        f"started needs at least {MIN_ENGINE_S} s")
    if not 0 < args.port < 65536:
        problems.append(f"--port {args.port} must be in 1..65535")
    for problem in (model_problem(args.model, args.weights), partition_problem(args)):
        if problem:
            problems.append(problem)
    return problems


def partition_problem(args: argparse.Namespace) -> str | None:
    """Why ``--layer-partition`` does not fit ``--pp`` (and the shape's layers), or None."""
    parts = args.layer_partition
    if parts is None:
        return None
    if len(parts) != args.pp:
        return f"--layer-partition {','.join(map(str, parts))} must name {args.pp} stages (--pp)"
    layers = SHAPES[args.model]["num_hidden_layers"] if args.model in SHAPES else sum(parts)
    if sum(parts) != layers:
        return (f"--layer-partition {','.join(map(str, parts))} splits {sum(parts)} layers; "
                f"--model {args.model} has {layers}")
    return None


def looks_like_hub_id(model: str) -> bool:
    """``ORG/NAME``, as vLLM resolves on the Hugging Face Hub (not a local path)."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", model) is not None and not model.startswith((".", "~"))


def model_problem(model: str, weights: str) -> str | None:
    """Why ``--model`` with ``--weights`` cannot run, or None."""
    if model in SHAPES:
        if weights == "random" and not has_random_weights(model):
            return (f"--model {model} has no random checkpoint (MoE, or too big to write); "
                    "add --weights dummy")
        return None
    if Path(model).expanduser().is_dir() or looks_like_hub_id(model):
        return None
    return (f"--model {model} is neither a model directory nor a built-in shape "
            f"({', '.join(sorted(SHAPES))})")


def expected_difference(report: dict[str, Any]) -> bool:
    """Other tokens than the reference's from an engine that repeats itself at another
    layout: reported, not a failure."""
    return bool(report.get("repeats_itself") and report.get("reference_layout_differs"))


def disagreement_lines(reports: list[dict[str, Any]]) -> list[str]:
    """One line per run whose tokens are not its reference's: ``TOKENS DIFFER`` (a
    fault, or a cause the line names), or ``near ties only`` (rounding).

    Under the plugin's measured cadence (``auto``) which requests decode together
    depends on timing, so where a model's kernels round by batch (MoE) its tokens can
    differ from stock's, and between its own passes, with nothing wrong: the line
    then says which runner keeps stock's batches.
    """
    lines = []
    for r in reports:
        if r.get("tokens_agree") is not False:
            continue
        run = f"{r['spec']['runner']}:{r['spec']['mode']}"
        verdict = r.get("divergence")
        if not r["repeats_itself"]:
            line = (f"TOKENS DIFFER: {run} gave other tokens in its timed passes than in its "
                    f"warm-up ({r['run_digests']} vs {r['digest']})")
        elif r.get("tokens_verdict") == "near-ties":
            lines.append(f"tokens differ at near ties only: {run} vs {r['tokens_reference']}: "
                         f"{verdict['requests_differ']} of {verdict['requests']} requests, each "
                         "parting where both runs' tokens lie within "
                         f"{verdict['near_tie_nats']} nats of the top choice (largest "
                         f"{verdict['largest_margin']}): rounding, not a fault")
            continue
        else:
            share = (f" ({r['requests_differ']} of {len(r['request_digests'])} requests)"
                     if "requests_differ" in r else "")
            line = f"TOKENS DIFFER: {run} vs {r['tokens_reference']}{share}"
            if verdict:
                line += (f", {verdict['beyond_near_tie']} beyond a near tie of "
                         f"{verdict['near_tie_nats']} nats (first: {verdict['first_beyond'][0]})")
        if r.get("stock_control"):
            line += ("; this is stock against itself, so this host's engines cannot decide "
                     "whether another runner's tokens are right")
        elif expected_difference(r):
            line += (f"; its layout ({layout_text(r)}) is not its reference's: tensor "
                     "parallelism sums in another order, so other tokens are expected, not a "
                     "failure")
        elif runner_cadence(r["spec"]["runner"]) == "auto":
            line += ("; its decode cadence (auto) groups decodes by measured time, which "
                     "changes tokens where kernels round by batch (MoE): for a token check "
                     f"run plugin-cadence:{r['spec']['mode']} (vLLM's cadence)")
        lines.append(line)
    return lines


def gpu_shortage(pp: int, tp: int, gpus: int) -> str:
    """Why ``--pp pp --tp tp`` cannot run on ``gpus`` GPUs, with only advice the bench accepts."""
    need = f"{pp * tp} NVIDIA GPU" + ("s" if pp * tp > 1 else "")
    advice = f"Run it on a host with at least {need}"
    if gpus // tp >= MIN_PP:
        advice += f", or with --pp {gpus // tp}" + (" or fewer" if gpus // tp > MIN_PP else "")
    elif tp > 1 and gpus // pp >= 1:
        advice += f", or with --tp {gpus // pp}" + (" or fewer" if gpus // pp > 1 else "")
    asked, per_stage = (f"--pp {pp}", "one") if tp == 1 else (f"--pp {pp} --tp {tp}", str(tp))
    return (f"{asked} needs {need} ({per_stage} per pipeline stage) but {gpus} "
            f"{'is' if gpus == 1 else 'are'} visible. {advice}")


def judge_tokens(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    """``tokens_agree`` on every report: judged in the batch workload, else None."""
    if args.workload == "batch":
        check_agreement(reports, args.near_tie_nats)
    for report in reports:
        report.setdefault("tokens_agree", None)


def write_results(args: argparse.Namespace, reports: list[dict[str, Any]],
                  complete: bool) -> Path:
    """Write OUT/bench.json with the runs so far; ``complete`` once every run has had its turn.

    Written after each run, to a temporary file renamed over the last one, so that an
    invocation cut short (a lease ending, a kill) leaves every finished run's numbers
    and never half a file.
    """
    judge_tokens(args, reports)
    result = {
        "command": sys.argv,
        "args": {k: str(v) for k, v in vars(args).items()},
        "complete": complete,
        "runs": reports,
        "across_engines": across_engines(reports),
    }
    path = args.out / "bench.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=1))
    os.replace(partial, path)
    return path


def visible_gpus() -> int:
    """NVIDIA GPUs this process can use, without initialising CUDA in it."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_impossible(parser, args)
    shape, model = prepare_model(args)
    reports = run_engines(args, shape, model)
    unloaded = plugin_not_loaded(args, reports)
    add_predictions(args, reports)
    print_findings(args, reports, unloaded)
    judge_tokens(args, reports)
    print()
    print(render_table(reports))
    print_profiles(reports)
    for line in disagreement_lines(reports):
        print(line)
    for row in across_engines(reports):
        print(
            f"across engines: {row['run']} median {row['median_req_per_s']} req/s over "
            f"{row['engines']} engines ({row['min_req_per_s']}..{row['max_req_per_s']})"
        )
    path = write_results(args, reports, complete=True)
    write_plot(reports, args.out / "bench.png")
    print(f"\nwrote {path}")
    return exit_status(args, reports, unloaded)


def add_predictions(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    """``plan``'s prediction beside each run that has a speed (``predicted`` in
    bench.json), and a console line with the error; on the NVLink default."""
    from vllm_pp_cudagraph.cli import read_model_config
    from vllm_pp_cudagraph.planning.plan import predict_run

    try:
        config = read_model_config(args.model)
    except ValueError:
        return
    for report in reports:
        if not report.get("req_per_s"):
            continue
        point = {k: report[k] for k in ("concurrency", "input_len") if report.get(k)}
        prediction = predict_run(config, {**report["spec"], **point})
        if prediction is None:
            continue
        report["predicted"] = {"req_per_s": round(prediction.req_per_s, 2),
                               "tpot_ms": round(prediction.tpot_s * 1e3, 2),
                               "cadence": prediction.cadence}
        print(f"plan predicted {_cell(report, 'run', '{}')}: {prediction.req_per_s:.2f} req/s "
              f"({prediction.req_per_s / report['req_per_s'] - 1:+.0%} of the measured "
              f"{report['req_per_s']:.2f})")


def refuse_impossible(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit (status 2, nothing written) on arguments no run can use, then on too few GPUs."""
    problems = argument_problems(args)
    if problems:
        parser.error("; ".join(problems) + ". Nothing was started or written.")
    gpus = visible_gpus()
    if gpus < args.pp * args.tp:
        parser.exit(EXIT_NO_GPU, f"vllm-pp-cudagraph bench: "
                    f"{gpu_shortage(args.pp, args.tp, gpus)}; nothing was written.\n")


def prepare_model(args: argparse.Namespace) -> tuple[str, str | None]:
    """(shape, model directory): a built-in shape is written under OUT where the runs need
    files (a tokenizer to serve, random weights); None leaves it to each engine."""
    shape, model = (args.model, None) if args.model in SHAPES else ("qwen3-0.6b", args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    serving = args.serve or args.workload == "serve"
    if model is None and (serving or args.weights == "random"):
        model = str(
            write_model_dir(
                args.out / "model", shape, tokenizer=serving, weights=args.weights == "random"
            )
        )
    return shape, model


def log_names(modes: list[tuple[str, str, float | None]]) -> list[str]:
    """Each run's log name: RUNNER-MODE[-UTIL], with -runN from a run's second time on
    (e.g. stock twice, to see run-to-run noise)."""
    names, seen = [], {}
    for runner, mode, utilization in modes:
        name = f"{runner}-{mode}" + (f"-{utilization}" if utilization else "")
        seen[name] = seen.get(name, 0) + 1
        names.append(name + (f"-run{seen[name]}" if seen[name] > 1 else ""))
    return names


def run_engines(args: argparse.Namespace, shape: str, model: str | None) -> list[dict[str, Any]]:
    """Every run of ``--modes`` in turn, those --deadline leaves time for; their reports,
    written to bench.json as each ends."""
    reports: list[dict[str, Any]] = []
    started = time.monotonic()
    for i, ((runner, mode, utilization), log_name) in enumerate(
            zip(args.modes, log_names(args.modes)), 1):
        timeout = args.timeout
        if args.deadline is not None:
            timeout = min(timeout, args.deadline - (time.monotonic() - started))
            if timeout < MIN_ENGINE_S:
                print(f"[{i}/{len(args.modes)}] {runner}:{mode}: skipped (--deadline)", flush=True)
                continue
        spec = run_spec(args, runner, mode, utilization, shape, model, log_name)
        print(f"[{i}/{len(args.modes)}] {spec.name}{layout_label(asdict(spec))} ...", flush=True)
        reports += run_one(args, spec, model, args.out / f"{log_name}.log", timeout)
        write_results(args, reports, complete=False)
        elapsed = time.monotonic() - started
        print(f"    {engine_status(reports[-1], log_name)}  [{elapsed:.0f} s elapsed]", flush=True)
    return reports


def run_one(args: argparse.Namespace, spec: RunSpec, model: str | None, log_path: Path,
            timeout: float) -> list[dict[str, Any]]:
    """One engine or server of the workload; its reports (a serve sweep: one per concurrency)."""
    if args.workload == "serve":
        reports = run_vllm_bench_sweep(spec, model, log_path, args.points or args.concurrency,
                                       args.num_requests or args.prompts, port=args.port,
                                       startup_timeout_s=timeout)
    elif args.serve:
        reports = [run_serve_mode(spec, model, serve_load_spec(args), log_path, port=args.port,
                                  startup_timeout_s=timeout)]
    else:
        return [run_in_subprocess(spec, log_path, timeout)]
    for report in reports:
        report["returncode"] = 0 if report.get("shutdown_clean") else report.get("shutdown_rc")
    return reports


def plugin_not_loaded(args: argparse.Namespace,
                      reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plugin runs that logged the plugin's runner on fewer than --pp stages: stock runs.
    None at PP=1, where the plugin stands aside by design."""
    return [r for r in reports if r["spec"]["runner"].startswith("plugin") and args.pp > 1
            and r.get("plugin_stages", args.pp) < args.pp]


def print_findings(args: argparse.Namespace, reports: list[dict[str, Any]],
                   unloaded: list[dict[str, Any]]) -> None:
    """What the runs' logs say beyond their numbers, one console line each."""
    for r in unloaded:
        print(f"PLUGIN NOT LOADED: {r['spec']['runner']}:{r['spec']['mode']} logged the plugin's "
              f"runner on {r['plugin_stages']} of {args.pp} stages; its numbers are not the plugin's")
    for r in reports:
        if r["spec"]["runner"] == "plugin-direct" and r.get("direct_handoff_stages", 0) < args.pp:
            print(f"DIRECT HAND-OFF NOT ON: {r['spec']['mode']} logged it on "
                  f"{r.get('direct_handoff_stages', 0)} of {args.pp} stages")
        if r.get("layer_partition_used") and not r["spec"].get("layer_partition"):
            used = r["layer_partition_used"]
            print(f"layer partition: {r['spec']['runner']}:{r['spec']['mode']} used "
                  f"{','.join(map(str, used))} (vLLM's split: "
                  f"{','.join(map(str, vllm_split(sum(used), len(used))))})")
        if r.get("jit_compiles"):
            print(f"compiled while serving: {r['spec']['runner']}:{r['spec']['mode']}: "
                  f"{', '.join(r['jit_compiles'])} (vLLM's JIT monitor; each is a latency spike)")


def print_profiles(reports: list[dict[str, Any]]) -> None:
    """Each profiled run's per-rank medians and busiest host operations per decode step."""
    for r in reports:
        if r.get("profile_error"):
            print(f"profile {r['spec']['runner']}:{r['spec']['mode']}: {r['profile_error']}")
        for rank, summary in sorted(r.get("profile", {}).items()):
            medians = {k: v for k, v in summary.items() if k != "host_ops"}
            print(f"profile {r['spec']['runner']}:{r['spec']['mode']} {rank}: {medians}")
            for window, ops in summary.get("host_ops", {}).items():
                top = ", ".join(f"{op['name']} {op['calls']}x {op['us']} us" for op in ops[:6])
                print(f"  host per decode step, {window}: {top}")


def exit_status(args: argparse.Namespace, reports: list[dict[str, Any]],
                unloaded: list[dict[str, Any]]) -> int:
    """EXIT_FAILED if a run failed or did not load the plugin, or (batch) gave tokens it must
    not: tokens that differ from its reference's beyond near ties, stock's control included."""
    failed = [r for r in reports if not r.get("digest")] + unloaded
    if args.serve or args.workload != "batch":
        # Under changing batches vLLM is not batch-invariant: served outputs may
        # differ between modes, so disagreement is reported, not fatal.
        return EXIT_FAILED if failed else EXIT_OK
    differ = [r for r in reports if r.get("tokens_verdict") == "differ"
              and not expected_difference(r)]
    return EXIT_FAILED if failed or differ else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
