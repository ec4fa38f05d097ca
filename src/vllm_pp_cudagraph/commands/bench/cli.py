"""``vllm-pp-cudagraph bench``: throughput and latency per CUDA-graph mode at PP.

``main`` wires the option parsing, the refusals, the runs, their verdicts and the report.
"""

from __future__ import annotations

import argparse
import sys

from vllm_pp_cudagraph.commands.bench import lanes
from vllm_pp_cudagraph.commands.bench.argument_checks import argument_problems, gpu_shortage
from vllm_pp_cudagraph.commands.bench.arguments import (
    add_engine_options,
    add_result_options,
    add_serving_options,
    add_workload_options,
)
from vllm_pp_cudagraph.commands.bench.judging import exit_status, judge_tokens, plugin_not_loaded
from vllm_pp_cudagraph.commands.bench.report import (
    add_predictions,
    print_findings,
    print_summary,
    write_plot,
    write_results,
)
from vllm_pp_cudagraph.commands.bench.runs import prepare_model, run_engines
from vllm_pp_cudagraph.commands.cli.exit_status import EXIT_NO_GPU, TABLE, ArgumentParser


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


def visible_gpus() -> int:
    """NVIDIA GPUs this process can use, without initialising CUDA in it."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def refuse_impossible(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit (status 2, nothing written) on arguments no run can use, then on too few GPUs."""
    problems = argument_problems(args)
    if problems:
        parser.error("; ".join(problems) + ". Nothing was started or written.")
    gpus = visible_gpus()
    if gpus < args.pp * args.tp:
        parser.exit(EXIT_NO_GPU, f"vllm-pp-cudagraph bench: "
                    f"{gpu_shortage(args.pp, args.tp, gpus)}; nothing was written.\n")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_impossible(parser, args)
    lanes.configure(args.lane_sync, args.lane)
    shape, model = prepare_model(args)
    reports = run_engines(args, shape, model)
    unloaded = plugin_not_loaded(args, reports)
    add_predictions(args, reports)
    print_findings(args, reports, unloaded)
    judge_tokens(args, reports)
    print_summary(reports)
    path = write_results(args, reports, complete=True)
    write_plot(reports, args.out / "bench.png")
    print(f"\nwrote {path}")
    return exit_status(args, reports, unloaded)


if __name__ == "__main__":
    sys.exit(main())
