"""The GPU checks' way to run ``vllm-pp-cudagraph bench --workload batch`` and read its
verdicts: each run's greedy tokens against stock's, judged at near ties."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


#: Every token check compiles in Inductor's deterministic mode: engines built alike
#: then run the same kernels instead of ones timed at start (bench --help), and a short
#: max_model_len keeps the fixed KV cache of stages sharing one GPU enough at PP=1.
TOKEN_CHECK_FLAGS = ("--deterministic-compile", "--max-model-len", "4096")


def run_batch_bench(out: Path, model, modes: str, *extra: str, env: dict | None = None,
                    timeout_s: int = 3000) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``bench --workload batch`` with ``modes`` (64 prompts x 64 tokens unless ``extra``
    says otherwise); the process and its runs in order."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.commands.cli", "bench", "--workload", "batch",
         "--model", str(model), "--modes", modes, "--prompts", "64", "--output-len", "64",
         "--repeat", "0", "--timeout", "600", "--out", str(out), *TOKEN_CHECK_FLAGS, *extra],
        capture_output=True, text=True, timeout=timeout_s, env=env,
    )
    path = out / "bench.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    return proc, runs


def console_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-4000:] + proc.stderr[-2000:]


def assert_served(runs: list[dict], ranks: int, console: str) -> None:
    """Every run served; plugin runs on all ``ranks`` workers (at PP=1: none, each worker
    saying the plugin stands aside), stock runs on none."""
    assert runs, console
    for run in runs:
        name = f"{run['spec']['runner']}:{run['spec']['mode']}"
        assert run.get("digest"), f"{name} failed to serve ({run.get('error_tail', '')[-800:]})"
        if run["spec"]["runner"] == "stock":
            assert run.get("plugin_stages", 0) == 0, f"{name} ran with the plugin loaded"
        elif run["spec"]["pp"] == 1:
            assert run["plugin_stages"] == 0 and run["stand_aside_ranks"] >= ranks, (
                f"{name}: at PP=1 the plugin must stand aside on every worker")
        else:
            assert run["plugin_stages"] == ranks, (
                f"{name}: the plugin's runner on {run['plugin_stages']} of {ranks} workers")


def assert_tokens_judged_equal(runs: list[dict]) -> None:
    """Stock's control (stock against itself) and every plugin run against stock of its
    mode: identical tokens, or parting only at near ties (rounding). A control that
    differs beyond a near tie means this host cannot decide, and fails as such."""
    controls = [r for r in runs if r.get("stock_control")]
    assert controls, "no stock-against-stock control ran"
    for run in controls:
        assert run["tokens_verdict"] in ("identical", "near-ties"), (
            f"stock differs from itself beyond a near tie in {run['spec']['mode']}: the token "
            f"check cannot decide here ({run.get('divergence')})")
    for run in runs:
        if run["spec"]["runner"] == "stock":
            continue
        assert run["tokens_reference"] == f"stock:{run['spec']['mode']}", run["tokens_reference"]
        assert run["tokens_verdict"] in ("identical", "near-ties"), (
            f"{run['spec']['runner']}:{run['spec']['mode']}: {run.get('requests_differ')} "
            f"requests differ from stock's, beyond a near tie: {run.get('divergence')}")


def verdict_line(runs: list[dict]) -> str:
    """One line: each run's verdict (and its share of differing requests)."""
    return "; ".join(
        f"{r['spec']['runner']}:{r['spec']['mode']} {r.get('tokens_verdict')}"
        + (f" ({r['divergence']['requests_differ']}/{r['divergence']['requests']}, largest "
           f"{r['divergence']['largest_margin']})" if r.get("divergence") else "")
        for r in runs)


def judged_against(reference: dict, runs: list[dict]) -> list[dict]:
    """The token judge's verdict (``bench/token_judge.py``) on each of ``runs``' greedy
    tokens against ``reference``'s: for runs of separate bench invocations, which the
    bench does not judge against each other."""
    from vllm_pp_cudagraph.commands.bench.token_judge import TokenRecord, judge

    theirs = TokenRecord.load(reference["spec"]["tokens_file"])
    return [judge(TokenRecord.load(run["spec"]["tokens_file"]), theirs) for run in runs]
