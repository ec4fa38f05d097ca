"""Verdicts on ``bench``'s runs: whose tokens agree with their reference's, which runs
ran without the plugin, and the exit status they give."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.bench.engine_run import TENSOR_PARALLEL_RUNNERS, TOKEN_FAMILY
from vllm_pp_cudagraph.commands.bench.token_judge import NEAR_TIE_NATS, TokenRecord, judge
from vllm_pp_cudagraph.commands.cli.exit_status import EXIT_FAILED, EXIT_OK


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


def expected_difference(report: dict[str, Any]) -> bool:
    """Other tokens than the reference's from an engine that repeats itself at another
    layout: reported, not a failure."""
    return bool(report.get("repeats_itself") and report.get("reference_layout_differs"))


def judge_tokens(args: argparse.Namespace, reports: list[dict[str, Any]]) -> None:
    """``tokens_agree`` on every report: judged in the batch workload, else None."""
    if args.workload == "batch":
        check_agreement(reports, args.near_tie_nats)
    for report in reports:
        report.setdefault("tokens_agree", None)


def plugin_not_loaded(args: argparse.Namespace,
                      reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plugin runs that logged the plugin's runner on fewer than --pp stages: stock runs.
    None at PP=1, where the plugin stands aside by design."""
    return [r for r in reports if r["spec"]["runner"].startswith("plugin") and args.pp > 1
            and r.get("plugin_stages", args.pp) < args.pp]


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
