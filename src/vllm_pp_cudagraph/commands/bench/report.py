"""What ``bench`` shows and keeps of its runs: the console table and findings, plan's
predictions beside them, bench.json and bench.png."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.engine_run import runner_cadence
from vllm_pp_cudagraph.commands.bench.judging import expected_difference, judge_tokens, layout
from vllm_pp_cudagraph.shared.vllm_surface import vllm_split

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


def layout_label(spec: dict[str, Any]) -> str:
    """`` [TP 2]`` or `` [PP 2 x TP 2]`` for runs with tensor parallelism; else nothing."""
    pp, tp = spec.get("pp", 0), spec.get("tp", 1)
    if tp == 1:
        return ""
    return f" [TP {tp}]" if pp == 1 else f" [PP {pp} x TP {tp}]"


def layout_text(report: dict[str, Any]) -> str:
    pp, tp = layout(report)
    return f"PP {pp} x TP {tp}"


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


def print_summary(reports: list[dict[str, Any]]) -> None:
    """The table of runs, then each profile, token disagreement and median across engines."""
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
        if r.get("prefix_cache_emptied") is False:
            print(f"PREFIX CACHE KEPT: {r['spec']['runner']}:{r['spec']['mode']}: vLLM did not "
                  "empty its prefix cache before a timed pass, so that pass may have found its "
                  "prompts cached and skipped their prefill")
        if r.get("gpu_neighbours"):
            print(f"GPU SHARED: {r['spec']['runner']}:{r['spec']['mode']}: other processes "
                  f"computed on its GPUs before or after it ran ("
                  + ", ".join(f"pid {n['pid']}" for n in r["gpu_neighbours"])
                  + "); its speed, and in compiled graph modes its tokens, are not "
                  "comparable with another run's")
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


def add_predictions(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    """``plan``'s prediction beside each run that has a speed (``predicted`` in
    bench.json), and a console line with the error; on the NVLink default."""
    from vllm_pp_cudagraph.commands.planning.plan import predict_run
    from vllm_pp_cudagraph.commands.planning.shapes import read_model_config

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
                               "ttft_ms": (None if prediction.ttft_s is None
                                           else round(prediction.ttft_s * 1e3, 1)),
                               "cadence": prediction.cadence}
        print(f"plan predicted {_cell(report, 'run', '{}')}: {prediction.req_per_s:.2f} req/s "
              f"({prediction.req_per_s / report['req_per_s'] - 1:+.0%} of the measured "
              f"{report['req_per_s']:.2f})")


def write_results(args: argparse.Namespace, reports: list[dict[str, Any]],
                  complete: bool) -> Path:
    """Write OUT/bench.json with the runs so far; ``complete`` once every run has had its turn.

    Written after each run, to a temporary file renamed over the last one, so that an
    invocation cut short (a deadline, a kill) leaves every finished run's numbers
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
