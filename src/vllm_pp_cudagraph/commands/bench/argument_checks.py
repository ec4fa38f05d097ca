"""What no run of ``bench`` can use: its arguments' problems, one message per flag, and
the GPUs a layout needs. Checked before anything starts."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, has_random_weights


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
    if args.request_rate is not None and not args.request_rate > 0:
        problems.append(f"--request-rate {args.request_rate} must be above 0 (requests per "
                        "second)")
    if args.request_rate is not None and args.workload != "serve":
        problems.append("--request-rate applies to --workload serve only")
    if not 0 < args.gpu_memory_utilization <= 1:
        problems.append(f"--gpu-memory-utilization {args.gpu_memory_utilization} must be in (0, 1]")
    if args.near_tie_nats < 0:
        problems.append(f"--near-tie-nats {args.near_tie_nats} must be at least 0")
    if args.timeout <= 0:
        problems.append(f"--timeout {args.timeout} must be positive (seconds per engine)")
    if args.deadline is not None and args.deadline < MIN_ENGINE_S:
        problems.append(f"--deadline {args.deadline} leaves no engine time to run: each one "
                        f"started needs at least {MIN_ENGINE_S} s")
    if args.lane_sync is not None and args.workload != "serve":
        problems.append("--lane-sync is for --workload serve (lanes meet before each point)")
    if args.max_cudagraph_capture_size is not None and args.max_cudagraph_capture_size < 1:
        problems.append(f"--max-cudagraph-capture-size {args.max_cudagraph_capture_size} "
                        "must be at least 1")
    if args.api_server_count < 1:
        problems.append(f"--api-server-count {args.api_server_count} must be at least 1")
    elif args.api_server_count > 1 and args.workload != "serve" and not args.serve:
        problems.append("--api-server-count is for --workload serve (API servers in front "
                        "of vllm serve's engine)")
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
