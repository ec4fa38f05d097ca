"""``bench``'s runs, one engine or server each: their specs, the model they share, and
their turns under ``--deadline``, each with its console line."""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.argument_checks import MIN_ENGINE_S
from vllm_pp_cudagraph.commands.bench.arguments import asked_backend
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES, token_word, write_model_dir
from vllm_pp_cudagraph.commands.bench.engine_run import (
    RunSpec,
    make_prompts,
    run_in_subprocess,
    runner_layout,
)
from vllm_pp_cudagraph.commands.bench.gpu_neighbours import gpu_neighbours, merged
from vllm_pp_cudagraph.commands.bench.report import layout_label, write_results
from vllm_pp_cudagraph.commands.bench.serve_load import LoadSpec
from vllm_pp_cudagraph.commands.bench.serve_run import run_serve_mode, run_vllm_bench_sweep
from vllm_pp_cudagraph.commands.bench.token_judge import TOP_LOGPROBS


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
    written to bench.json as each ends.

    Every mode runs in its own engine, one after another, in one invocation, so
    ratios between modes are measured on the same machine state. Each engine
    warms up on the exact workload (the first pass JIT-compiles kernels), then
    runs it ``--repeat`` times; the median run is reported. Greedy outputs are
    digested, and modes that must produce the same tokens are checked to do so.
    """
    reports: list[dict[str, Any]] = []
    started = time.monotonic()
    # One look at the GPUs between two runs serves as the first's after and the next's before.
    look = gpu_neighbours()
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
        before = look
        runs = run_one(args, spec, model, args.out / f"{log_name}.log", timeout)
        look = gpu_neighbours()
        neighbours = merged(before, look)
        for report in runs:
            report["gpu_neighbours"] = neighbours
        reports += runs
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
        api_servers=args.api_server_count,
        max_capture_size=args.max_cudagraph_capture_size,
        request_rate=args.request_rate,
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
