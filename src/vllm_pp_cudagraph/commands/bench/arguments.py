"""``vllm-pp-cudagraph bench``'s options: their groups, help texts and argparse types."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.bench.engine_run import INTERNAL_RUNNERS, MODES, RUNNERS
from vllm_pp_cudagraph.commands.bench.interconnect import INTERCONNECTS, SIMULATES
from vllm_pp_cudagraph.commands.bench.token_judge import NEAR_TIE_NATS


DEFAULT_MODES = [
    f"{runner}:{mode}"
    for mode in ("eager", "piecewise", "full_and_piecewise", "full_decode_only", "breakable")
    for runner in ("plugin", "stock")
] + ["v1:full_and_piecewise"]


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
    group.add_argument(
        "--request-rate", type=float, default=None, metavar="R",
        help="--workload serve: requests arrive as a Poisson process at R per second "
        "(vllm bench serve --request-rate), each point's concurrency the most in flight; "
        "default: a closed loop at that concurrency")
    group.add_argument("--port", type=int, default=8000, help="port of the server")
    group.add_argument(
        "--max-cudagraph-capture-size", type=int, default=None, metavar="N",
        help="capture CUDA graphs up to batches of N tokens, every runner alike "
        "(compilation_config.max_cudagraph_capture_size; default: vLLM's, 2 x "
        "--max-num-seqs and at most 512); larger decode steps run eagerly")
    group.add_argument(
        "--api-server-count", type=int, default=1,
        help="--workload serve: vLLM's API-server processes in front of each engine "
        "(vllm serve --api-server-count); where one API server bounds a small model's "
        "throughput, more let the engine's own speed show")
    group.add_argument(
        "--lane-sync", type=Path, default=None,
        help="--workload serve beside another bench invocation on other GPUs of this host "
        "(a lane each): a directory both name; before each point's warm-up the lanes wait "
        "for each other, so each pair of runners is measured in the same minutes "
        "(give each lane its own --port, --out and VLLM_PORT)")
    group.add_argument("--lane", default="a", help="this invocation's lane name (--lane-sync)")
