"""Serving soak at PP=2: every graph mode behind ``vllm serve``, compared with stock.

For each mode: the plugin serves the load once and stock vLLM (same graph-mode
family: compiled against compiled, eager and breakable against eager) twice,
or as often as ``--plugin-runs`` and ``--stock-runs`` say. vLLM is not
batch-invariant, so under changing batches some greedy outputs differ between
any two runs. The plugin passes when its share of differing requests against
stock (the mean over every plugin and stock pair of runs) is no higher than
stock's share between its own runs (the mean over their pairs). How much one
run's batches churn moves a share by several points, so more runs per side
give a steadier verdict. Each comparison also reports where differing texts
part (median first differing word): noise parts late, a mishandled request
early. Each request's text digest is kept in ``soak.json``, to compare runs
again afterwards, across soaks too. Every plugin run must also have no
request errors, answer every health check, and shut down cleanly.

``--token-check`` adds a check that does not depend on how batches formed: a
further stock server scores every completed output of every run, token by
token (prompt and output fed back as a prompt). Rounding only ever lets a
greedy run take a token within rounding of the top choice; the plugin's
tokens may fall at most twice as far below the top choice as stock's own do.
A lost, repeated or foreign token falls by the model's logit spread.

The share rule holds the plugin to stock's batches. A plugin runner that
decodes on another cadence than vLLM's (the defaults, ``balance`` or ``merge``)
forms other batches by design and flips more near-ties against stock than two
stock runs flip between themselves. For such a runner, with ``--token-check``
and outside batch invariance, the shares are reported (``share_rule``) and the
token check judges; ``--plugin-runner plugin-cadence`` keeps the share rule.

``--structured`` (with ``--sampling-mix``) makes about a quarter of the requests
JSON-schema ones: the servers then serve the shape with a byte-level vocabulary, so
the grammar can spell JSON, and every completed structured output of the plugin
must parse and match (stock's are checked and reported alike), with no grammar
rejection in its log.

Options add preemption, Ray, and vLLM's batch-invariant mode: where two stock
runs then agree on every request, the plugin must too. Under preemption every
server gets a KV cache too small for the load; each run must have preempted. Start-up refusals (bad settings) are checked to fail
with the named setting and leave no process behind; two of them serve models
whose stages disagree on the tensors they exchange (the test-only
``pp_e2e_models``, in ``tests/e2e/soak_plugins``;
install it next to this package. ``--lowered-mode`` serves FULL with FlashInfer
attention, which on Hopper runs CUDA graphs for single-token decodes only:
vLLM must lower the mode on every stage alike and say so, and the server must
serve.

    python -m benchmarks.tools.soak --out DIR [--modes piecewise,...] [--preemption] [--ray]
        [--batch-invariant] [--same-stock-mode] [--token-check] [--refusals] [--lowered-mode]
        (--modes "" --refusals: refusals only)
        [--plugin-runner plugin|plugin-cadence|plugin-kvsplit] [--plugin-runs P] [--stock-runs S]
        [--gpus 0,1 2,3] [--servers-per-gpus N --kv-cache-gib G]
        [--shape qwen3-32b ...] [--weights random|dummy] [--gpu-memory-utilization U] [--lora N]
        [--sampling-mix [--structured]] [--resume]

Servers run in slots, one GPU group and port each, as many at a time as there
are slots. Several servers may share one GPU group (``--servers-per-gpus``);
each then gets a fixed KV cache (``--kv-cache-gib``), because vLLM's memory
profiling reads the device's free memory and would count a neighbour's
allocations as its own. Timing is not compared here, only tokens and health.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path

from benchmarks.tools.lora_adapters import lora_mix, lora_serve_args, write_lora_adapter
from benchmarks.tools.sampling_mix import (
    SAMPLING_MIX,
    STRUCTURED_MIX,
    STRUCTURED_SERVE_ARGS,
    structured,
)
from benchmarks.tools.serve_checks import (
    GRAMMAR_REJECTIONS,
    byte_vocab_config,
    byte_vocab_model_dir,
)
from benchmarks.tools.soak_judge import (
    GreedyCheck,
    completed_sequences,
    differing_share,
    divergence_word,
    greedy_verdict,
    score_greedy,
    serving_problems,
    soak_verdict,
    structured_problems,
    text_digests,
)
from benchmarks.tools.soak_latency import (
    jit_monitor_args,
    stream_stalls,
    tpot_by_phase,
)
from benchmarks.tools.soak_store import load_report, run_settings, save_report
from benchmarks.tools.soak_watch import (
    ServerWatch,
    watch_problems,
    watch_summary,
)
from vllm_pp_cudagraph.commands.bench.dummy_model import (
    SHAPES,
    has_random_weights,
    token_word,
    write_model_dir,
)
from vllm_pp_cudagraph.commands.bench.engine_run import (
    RUNNERS,
    RunSpec,
    engine_env,
    records_dir_of,
    runner_cadence,
    serving_jit_events,
)
from vllm_pp_cudagraph.commands.bench.serve_load import LoadSpec
from vllm_pp_cudagraph.commands.bench.serve_run import run_serve_mode, serve_and_call, serve_command
from vllm_pp_cudagraph.commands.bench.stats import capture_stats
from vllm_pp_cudagraph.shared.snapshots import read_capture_records

MODES = ["piecewise", "full_and_piecewise", "full_decode_only", "breakable", "eager"]
#: Stock graph mode each plugin mode is compared with, by default (the issue's
#: families); ``--same-stock-mode`` compares every mode with stock's own.
STOCK_REFERENCE = {"breakable": "eager"}


def soak_prompts(count: int = 256) -> list[str]:
    """Prompts of 2..63 words (= tokens with the generated tokenizer)."""
    return [" ".join(token_word(1000 + (i * 131 + j * 17) % 140000) for j in range(2 + (i * 7) % 62))
            for i in range(count)]


def soak_load(args: argparse.Namespace, requests: int | None = None,
              concurrency: int | None = None, lora: bool = True) -> LoadSpec:
    """The soak's load: half the requests streamed, a tenth cancelled mid-stream,
    with ``--sampling-mix`` each request with one of the mix's sampling options,
    with ``--structured`` about a quarter of them JSON-schema requests, with
    ``--lora`` some sent to an adapter (greedy) instead."""
    mix = dict(SAMPLING_MIX) if getattr(args, "sampling_mix", False) else {}
    if getattr(args, "structured", False):
        mix |= STRUCTURED_MIX
    adapters = args.lora_adapters if lora else {}
    if adapters:
        mix = (mix or {"greedy": {}}) | lora_mix(adapters)
    return LoadSpec("", "", soak_prompts(), requests or args.requests,
                    concurrency or args.concurrency, args.max_tokens,
                    stream_fraction=0.5, cancel_fraction=0.1, sampling_mix=mix or None)


@dataclass(frozen=True)
class Slot:
    """Where one server runs: its GPUs, its port, and its KV cache if the GPUs are shared."""

    gpus: str
    port: int
    kv_cache_gib: float | None = None

    #: With a fixed KV cache, gpu_memory_utilization only sets the free memory vLLM
    #: demands at start-up, which neighbours on the same GPUs must leave.
    SHARED_UTILIZATION = 0.15

    def apply(self, spec: RunSpec) -> RunSpec:
        env = dict(spec.extra_env, CUDA_VISIBLE_DEVICES=self.gpus,
                   VLLM_CACHE_ROOT=str(Path(tempfile.gettempdir()) / f"soak-cache-{self.port}"))
        utilization = (spec.gpu_memory_utilization if self.kv_cache_gib is None
                       else self.SHARED_UTILIZATION)
        return replace(spec, extra_env=env, gpu_memory_utilization=utilization)

    def serve_args(self) -> list[str]:
        if self.kv_cache_gib is None:
            return []
        return ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30))]


def make_slots(gpu_groups: list[str], servers_per_gpus: int, base_port: int,
               kv_cache_gib: float | None) -> list[Slot]:
    if servers_per_gpus > 1 and kv_cache_gib is None:
        raise SystemExit("--servers-per-gpus above 1 needs --kv-cache-gib: servers sharing GPUs "
                         "cannot profile memory")
    groups = [g for _ in range(servers_per_gpus) for g in gpu_groups]
    return [Slot(g, base_port + 10 * i, kv_cache_gib) for i, g in enumerate(groups)]


def run_in_slots(tasks: list[Callable[[Slot], dict]], slots: list[Slot],
                 stagger_s: float = 5.0) -> list[dict]:
    """Run each task in the next free slot; results in task order.

    Starts are spaced by ``stagger_s`` so that servers starting together do not
    race for the same free ports.
    """
    free: queue.Queue[Slot] = queue.Queue()
    for slot in slots:
        free.put(slot)
    lock = threading.Lock()
    last_start = [0.0]

    def run(task: Callable[[Slot], dict]) -> dict:
        slot = free.get()
        with lock:
            time.sleep(max(0.0, last_start[0] + stagger_s - time.monotonic()))
            last_start[0] = time.monotonic()
        try:
            return task(slot)
        finally:
            free.put(slot)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        return list(pool.map(run, tasks))


def stock_mode_for(mode: str, same_stock_mode: bool = False) -> str:
    return mode if same_stock_mode else STOCK_REFERENCE.get(mode, mode)


def run_tags(plugin_runs: int = 1, stock_runs: int = 2) -> list[str]:
    """Names of one mode's runs: ``plugin``, ``plugin_b``, ..., ``stock_a``, ``stock_b``, ..."""
    letters = "abcdefghij"
    if not 1 <= plugin_runs <= len(letters) or not 2 <= stock_runs <= len(letters):
        raise ValueError(f"plugin_runs={plugin_runs} must be 1-{len(letters)} and "
                         f"stock_runs={stock_runs} 2-{len(letters)}")
    return (["plugin"] + [f"plugin_{c}" for c in letters[1:plugin_runs]]
            + [f"stock_{c}" for c in letters[:stock_runs]])


def mode_servers(mode: str, same_stock_mode: bool = False, plugin_runner: str = "plugin",
                 plugin_runs: int = 1, stock_runs: int = 2) -> list[tuple[str, str, str]]:
    """(runner, graph mode, run name) of the servers one mode's soak compares."""
    stock_mode = stock_mode_for(mode, same_stock_mode)
    return [(plugin_runner, mode, tag) if tag.startswith("plugin") else ("stock", stock_mode, tag)
            for tag in run_tags(plugin_runs, stock_runs)]


#: The model length of every server under --preemption, the token check's scorer
#: included: it scores sequences that long (vLLM's default length may not fit a fixed
#: KV cache).
PREEMPTION_MODEL_LEN = ["--max-model-len", "2048"]
#: The KV cache of every server under --preemption: small enough for ~3,000
#: preemptions per 2,000 requests.
PREEMPTION_ARGS = ["--num-gpu-blocks-override", "512", *PREEMPTION_MODEL_LEN]


def missing_test_plugin(name: str) -> str | None:
    """Why a test plugin from ``tests/e2e/soak_plugins`` cannot load, or None."""
    if any(ep.name == name for ep in entry_points(group="vllm.general_plugins")):
        return None
    return f"test plugin {name} not installed: pip install tests/e2e/soak_plugins"


def server_env(args: argparse.Namespace) -> dict[str, str]:
    return {"VLLM_BATCH_INVARIANT": "1"} if args.batch_invariant else {}


def model_spec(runner: str, run_mode: str, args: argparse.Namespace,
               extra_env: dict[str, str]) -> RunSpec:
    """A soak engine of the soak's model shape, weights and memory share."""
    return RunSpec(runner, run_mode, pp=args.pp, max_num_seqs=args.max_num_seqs,
                   shape=args.shape, weights=args.weights,
                   gpu_memory_utilization=args.gpu_memory_utilization,
                   extra_env=extra_env)


def server_spec(runner: str, run_mode: str, args: argparse.Namespace) -> RunSpec:
    """One soak server's engine."""
    return model_spec(runner, run_mode, args, server_env(args))


_STAGE_CAPTURE = re.compile(
    r"Worker_PP(\d+)\S*.*Graph capturing finished in [\d.]+ secs, took (\d+(?:\.\d+)?) GiB")

#: vLLM's log rounds both numbers to 0.01 GiB.
LOG_ROUNDING_GIB = 0.01


def graph_memory(log: str, records: Path) -> dict:
    """The plugin's CUDA-graph memory estimate per stage (reserved before the KV cache
    is sized; from its capture records in ``records``) beside what each stage's capture
    took (vLLM's log)."""
    estimates = {stage: round(record["estimated_gib"], 3)
                 for (stage, tp_rank), record in read_capture_records(records).items()
                 if tp_rank == 0 and record.get("estimated_gib") is not None}
    captured: dict[int, float] = {}
    for stage, gib in _STAGE_CAPTURE.findall(log):
        captured[int(stage)] = max(captured.get(int(stage), 0.0), float(gib))
    return {"estimated_gib": estimates, "captured_gib": captured,
            "captured_gib_max": capture_stats(log)["graph_gib"]}


def graph_memory_problems(memory: dict | None) -> list[str]:
    """Stages whose graphs took more than the plugin reserved for them before the KV
    cache was sized (the estimate's margin: never below what capture takes). Nothing
    to judge where vLLM measures graph memory itself (no estimate in the log)."""
    if not memory:
        return []
    problems = []
    for stage, estimate in sorted(memory.get("estimated_gib", {}).items()):
        took = memory.get("captured_gib", {}).get(stage)
        if took is not None and took > estimate + LOG_ROUNDING_GIB:
            problems.append(f"stage {stage}'s graphs took {took} GiB, more than the {estimate} "
                            "GiB reserved for them before the KV cache was sized")
    return problems


def serve_task(mode: str, runner: str, run_mode: str, tag: str, args: argparse.Namespace,
               model_dir: str, extra: list[str]) -> Callable[[Slot], dict]:
    def task(slot: Slot) -> dict:
        spec = slot.apply(server_spec(runner, run_mode, args))
        load = soak_load(args)
        log_path = args.out / f"{mode}-{tag.replace('_', '-')}.log"
        watch = ServerWatch(slot.gpus, records_dir_of(log_path), args.pp)
        report = run_serve_mode(spec, model_dir, load, log_path, port=slot.port,
                                extra_args=extra + slot.serve_args(), keep_texts=True,
                                watch=watch)
        report["slot"] = {"gpus": slot.gpus, "port": slot.port, "kv_cache_gib": slot.kv_cache_gib}
        if log_path.exists():
            log = log_path.read_text(errors="replace")
            report["graph_memory"] = graph_memory(log, records_dir_of(log_path))
            report["grammar_rejections"] = sum(log.count(line) for line in GRAMMAR_REJECTIONS)
            report["jit_compiles"] = serving_jit_events(log)
        print(f"[{mode} {tag}] gpus {slot.gpus}: {report.get('load') or report.get('error')}"
              f", preemptions {report.get('preemptions')}, shutdown rc {report.get('shutdown_rc')}",
              flush=True)
        save_report(args.out, mode, tag, report, run_settings(args))
        return report

    return task


def resumed_task(mode: str, tag: str, report: dict) -> Callable[[Slot], dict]:
    """A server that ran before (``--resume``): its saved report, nothing served."""
    def task(slot: Slot) -> dict:
        print(f"[{mode} {tag}] resumed (its saved report): "
              f"{report.get('load') or report.get('error')}", flush=True)
        return report

    return task


def token_check_task(mode: str, reports: dict[str, dict], args: argparse.Namespace,
                     model_dir: str) -> Callable[[Slot], dict]:
    """A stock server, in the mode the plugin is compared with, scoring every run's outputs."""
    runs = {name: completed_sequences(rep["load_report"]) for name, rep in reports.items()
            if "load_report" in rep}

    async def score_all(base_url: str) -> dict:
        return {name: await score_greedy(base_url, "dummy", seqs) for name, seqs in runs.items()}

    def task(slot: Slot) -> dict:
        spec = slot.apply(model_spec("stock", stock_mode_for(mode, args.same_stock_mode), args,
                                     server_env(args)))
        scorer_args = PREEMPTION_MODEL_LEN if args.preemption else []
        report = serve_and_call(spec, model_dir, args.out / f"{mode}-token-check.log", score_all,
                                port=slot.port, extra_args=scorer_args + slot.serve_args())
        checks = {name: report[name] for name in runs if name in report}
        scored = {name: (c.positions, c.not_first_choice, round(c.max_margin, 4))
                  for name, c in checks.items()}
        print(f"[{mode} token check] (tokens, not top choice, largest margin): {scored} "
              f"{report.get('error') or ''}", flush=True)
        return {"checks": checks, "error": report.get("error")}

    return task


def token_check_result(check: dict, runs: list[str] | None = None) -> dict:
    """Summaries and verdict of one mode's token check: each plugin run against every stock run.

    ``runs`` names the runs that had to be scored (default: one plugin, two stock runs).
    """
    checks: dict[str, GreedyCheck] = check["checks"]
    runs = runs or run_tags()
    missing = [name for name in runs if name not in checks]
    if check.get("error") or missing:
        why = check.get("error") or f"missing runs {missing}"
        return {"problems": [f"token check did not run: {why}"]}
    stock = max((checks[n] for n in runs if n.startswith("stock")), key=lambda c: c.max_margin)
    problems = [problem if name == "plugin" else f"{name}: {problem}"
                for name in runs if name.startswith("plugin")
                for problem in greedy_verdict(checks[name], stock)]
    return {**{name: c.summary() for name, c in checks.items()}, "problems": problems}


def schedules_like_stock(plugin_runner: str) -> bool:
    """Whether ``plugin_runner`` keeps vLLM's decode cadence, so batches form as stock's do."""
    return runner_cadence(plugin_runner) == "vllm"


def compared_pairs(runs: list[str]) -> dict[str, list[tuple[str, str]]]:
    """Which runs the soak compares: plugin against stock, stock against itself, plugin against itself."""
    plugin = [n for n in runs if n.startswith("plugin")]
    stock = [n for n in runs if n.startswith("stock")]
    return {"plugin_vs_stock": [(p, s) for p in plugin for s in stock],
            "stock_vs_stock": list(itertools.combinations(stock, 2)),
            "plugin_vs_plugin": list(itertools.combinations(plugin, 2))}


def mode_result(mode: str, reports: dict[str, dict], args: argparse.Namespace,
                extra: list[str]) -> dict:
    """One mode's verdict from its runs' reports (keys as :func:`run_tags` names them)."""
    result: dict = {"mode": mode, "pp": args.pp, "shape": args.shape, "weights": args.weights,
                    "lora": len(args.lora_adapters),
                    "plugin_runner": args.plugin_runner,
                    "stock_mode": stock_mode_for(mode, args.same_stock_mode),
                    "extra_args": extra, "batch_invariant": args.batch_invariant,
                    "preemption": args.preemption, "requests": args.requests,
                    "structured": args.structured,
                    "max_tokens": args.max_tokens}
    for name, rep in reports.items():
        result[name] = {k: rep.get(k) for k in ("load", "preemptions", "shutdown_rc",
                                                "shutdown_clean", "error", "slot", "graph_memory",
                                                "grammar_rejections", "jit_compiles")}
    if all("load_report" in r for r in reports.values()):
        texts = {name: rep["load_report"] for name, rep in reports.items()}
        for name, report in texts.items():
            result[name]["tpot_ms_by_phase"] = tpot_by_phase(report)
            result[name]["stalls"] = stream_stalls(report)
        # Each share is a mean over its pairs of runs: one comparison of 2,000
        # requests moves by several points from one run to the next, as much as
        # the margins the verdict is held to.
        for kind, pairs in compared_pairs(list(reports)).items():
            if not pairs:
                continue
            for x, y in pairs:
                result[f"{x}_vs_{y}"] = differing_share(texts[x], texts[y])
                result[f"{x}_vs_{y}_divergence_word"] = divergence_word(texts[x], texts[y])
            result[kind] = statistics.fmean(result[f"{x}_vs_{y}"] for x, y in pairs)
            result[f"{kind}_divergence_word"] = statistics.fmean(
                result[f"{x}_vs_{y}_divergence_word"] for x, y in pairs)
        result["request_digests"] = {name: text_digests(rep) for name, rep in texts.items()}
        shares_judge = (schedules_like_stock(args.plugin_runner) or not args.token_check
                        or args.batch_invariant)
        result["share_rule"] = "judges" if shares_judge else (
            "reported only: the plugin runner decodes on another cadence than stock, "
            "so its batches differ by design; the token check judges")
        result["problems"] = soak_verdict(reports["plugin"], result["plugin_vs_stock"],
                                          result["stock_vs_stock"], args.batch_invariant,
                                          shares_judge)
        result["problems"] += [f"{name}: {problem}" for name in reports
                               if name.startswith("plugin_")
                               for problem in serving_problems(reports[name])]
        result["problems"] += [f"{name}: {problem}" for name, rep in reports.items()
                               if name.startswith("plugin")
                               for problem in graph_memory_problems(rep.get("graph_memory"))]
        # Stock's watch is reported beside the plugin's; only the plugin's judges. What the
        # first requests allocate is vLLM's: the plugin's may not exceed stock_a's beside it.
        stock_watch = reports["stock_a"].get("watch")
        result["watch"] = {name: {**(watch_summary(rep.get("watch")) or {}), "problems":
                                  watch_problems(rep.get("watch"), name.startswith("plugin"),
                                                 stock_watch)}
                           for name, rep in reports.items()}
        result["problems"] += [f"{name}: {problem}" for name, found in result["watch"].items()
                               if name.startswith("plugin") for problem in found["problems"]]
        if args.structured:
            # Every run's structured outputs are checked; the plugin's must all pass.
            found = {name: structured_problems(rep) for name, rep in texts.items()}
            result["structured_checks"] = {
                name: {"checked": sum(structured(r.sampling) and r.completed
                                      for r in texts[name].results),
                       "problems": len(problems), "first": problems[:3]}
                for name, problems in found.items()}
            result["problems"] += [f"{name}: {problem}" for name, problems in found.items()
                                   if name.startswith("plugin") for problem in problems[:5]]
            result["problems"] += [
                f"{name}: the grammar rejected tokens {rep['grammar_rejections']} times (log)"
                for name, rep in reports.items()
                if name.startswith("plugin") and rep.get("grammar_rejections")]
        if args.preemption:
            result["problems"] += [
                f"{name}: no request was preempted (vllm:num_preemptions="
                f"{rep.get('preemptions')}); lower --num-gpu-blocks-override"
                for name, rep in reports.items() if not rep.get("preemptions")]
    else:
        result["problems"] = [f"{name}: {rep.get('error')}" for name, rep in reports.items()
                              if "load_report" not in rep]
    result["passed"] = not result["problems"]
    return result


def refused_start(name: str, env_overrides: dict, cli_extra: list[str], expect: str,
                  model_dir: str, out: Path, slot: Slot, timeout_s: float = 300,
                  weights: str = "random") -> dict:
    """Start a server that must refuse to start; check the message and leftovers."""
    spec = slot.apply(RunSpec("plugin", "piecewise", pp=2, weights=weights))
    env = engine_env(spec) | env_overrides
    log_path = out / f"refused-{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(spec, model_dir, slot.port,
                                              cli_extra + slot.serve_args()), env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = None
    time.sleep(5)
    try:
        os.killpg(proc.pid, 0)
        leftovers = True
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        leftovers = False
    text = log_path.read_text(errors="replace")
    result = {"case": name, "returncode": rc, "message_found": expect in text,
              "leftover_processes": leftovers,
              "passed": rc not in (0, None) and expect in text and not leftovers}
    print(json.dumps(result), flush=True)
    return result


#: Test models whose stages disagree on one exchanged tensor, and the message
#: that must stop their start-up.
MISMATCH_MODELS = [
    ("stage-mismatch-model", "StageMismatchQwen3ForCausalLM", "missing keys ['aux']"),
    ("undeclared-output-model", "UndeclaredOutputQwen3ForCausalLM",
     "(tensors returned by the model's forward in the profiling run): unexpected keys ['aux']"),
]


def refused_mismatch_model(case: str, arch: str, expect: str, out: Path, slot: Slot) -> dict:
    """Serve a model whose stages disagree on the tensors they exchange.

    The models come from the test-only vLLM plugin ``pp_e2e_models``.
    """
    missing = missing_test_plugin("pp_e2e_models")
    if missing:
        return {"case": case, "passed": False, "problem": missing}
    model_dir = write_model_dir(tempfile.mkdtemp(prefix=f"soak-{case}-"), tokenizer=True)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = [arch]
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return refused_start(case, {"VLLM_PLUGINS": "pp_cudagraph,pp_e2e_models"}, [],
                         expect, str(model_dir), out, slot, weights="dummy")


#: A graph mode the attention backend cannot run. On Hopper, FlashInfer's
#: attention supports CUDA graphs for single-token decodes only, so FULL (graphs
#: for mixed batches too) is lowered by vLLM on every stage, with a warning that
#: names the backend and the mode it sets. Lines of the log that must say so.
LOWERED_MODE_MESSAGE = ("CUDAGraphMode.FULL is not supported with FlashInferBackend",
                        "setting cudagraph_mode=FULL_AND_PIECEWISE")


def lowered_mode_check(model_dir: str, out: Path, slot: Slot, args: argparse.Namespace,
                       requests: int = 200) -> dict:
    """Serve FULL with FlashInfer attention: every stage must lower the mode alike, say so, and serve."""
    spec = slot.apply(replace(model_spec("plugin", "full", args, {}), attention_backend="FLASHINFER"))
    load = soak_load(args, requests, min(args.concurrency, 64), lora=False)
    log_path = out / "lowered-mode.log"
    report = run_serve_mode(spec, model_dir, load, log_path, port=slot.port,
                            extra_args=slot.serve_args())
    lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
    told = {stage: next((line for line in lines if f"Worker_PP{stage}" in line
                         and all(part in line for part in LOWERED_MODE_MESSAGE)), None)
            for stage in range(args.pp)}
    problems = serving_problems(report)
    problems += [f"pipeline stage {stage} did not log the lowered mode ({LOWERED_MODE_MESSAGE})"
                 for stage, line in told.items() if line is None]
    result = {"case": "lowered-mode", "load": report.get("load"), "told": told,
              "shutdown_rc": report.get("shutdown_rc"), "problems": problems,
              "passed": not problems}
    print(json.dumps(result), flush=True)
    return result


REFUSALS = [
    ("breakable-with-enforce-eager", {"VLLM_PP_CUDAGRAPH_BREAKABLE": "1"}, ["--enforce-eager"],
     "Drop one of the two settings"),
    ("v1-runner-with-plugin", {"VLLM_USE_V2_MODEL_RUNNER": "0"}, [],
     "VLLM_USE_V2_MODEL_RUNNER='0' selects the V1 runner"),
    ("bad-plugin-setting", {"VLLM_PP_CUDAGRAPH_BREAKABLE": "sometimes"}, [],
     "VLLM_PP_CUDAGRAPH_BREAKABLE='sometimes'"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES),
                        help="the built-in model shape every server serves")
    parser.add_argument("--weights", choices=("random", "dummy"), default=None,
                        help="seeded random checkpoint (default where the shape has one: dense "
                             "Qwen3 up to 4B) or vLLM's dummy loader (default for bigger shapes; "
                             "its outputs barely depend on the layers, so the token check is weak)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="per server, where GPUs are not shared (big shapes need more)")
    parser.add_argument("--port", type=int, default=8000, help="first slot's port (+10 per slot)")
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages of every server")
    parser.add_argument("--gpus", nargs="+",
                        default=[os.environ.get("CUDA_VISIBLE_DEVICES") or "0,1"],
                        help="GPU groups, one per server: PP GPUs each, or one that every "
                             "stage shares (default: CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--servers-per-gpus", type=int, default=1,
                        help="servers that may run on one GPU group at a time")
    parser.add_argument("--kv-cache-gib", type=float, default=None,
                        help="fixed KV cache per server (needed when GPUs are shared)")
    parser.add_argument("--preemption", action="store_true",
                        help="KV cache of 512 blocks on every server, so requests are preempted and "
                             "resumed; stock runs with the plugin's scheduler fix alone")
    parser.add_argument("--plugin-runner", default="plugin",
                        choices=[r for r in RUNNERS if r.startswith("plugin")],
                        help="the plugin's engine: plugin-cadence keeps vLLM's PP decode cadence "
                             "(idle steps not filled), plugin-kvsplit vLLM's split at the KV-cache write")
    parser.add_argument("--sampling-mix", action="store_true",
                        help="give each request one of sampling_mix.SAMPLING_MIX's options (seeded "
                             "sampling, penalties, n=2, logprobs, stop strings) instead of greedy; "
                             "the token check scores the ones that follow the top choice")
    parser.add_argument("--structured", action="store_true",
                        help="with --sampling-mix: about a quarter of the requests ask for JSON "
                             "matching sampling_mix.SCHEMA (three of the mix's eleven options), "
                             "and every structured output of every run must parse and match; "
                             "the servers serve the shape with a byte-level vocabulary so its "
                             "grammar can spell JSON")
    parser.add_argument("--lora", type=int, default=0, metavar="N",
                        help="serve N seeded random LoRA adapters beside the base model "
                             "(--enable-lora); requests go to the base model or an adapter by "
                             "their seed, and only base-model greedy ones are token-checked")
    parser.add_argument("--ray", action="store_true", help="--distributed-executor-backend ray")
    parser.add_argument("--refusals", action="store_true", help="also check start-up refusals")
    parser.add_argument("--lowered-mode", action="store_true",
                        help="also serve FULL with FlashInfer attention, which vLLM must lower "
                             "on every stage and say so (see LOWERED_MODE_MESSAGE)")
    parser.add_argument("--same-stock-mode", action="store_true",
                        help="compare breakable with stock breakable, not stock eager")
    parser.add_argument("--token-check", action=argparse.BooleanOptionalAction, default=False,
                        help="score every output token with a further stock server (see above)")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="VLLM_BATCH_INVARIANT=1 on every server: where two stock runs then "
                             "agree exactly, the plugin must too")
    parser.add_argument("--plugin-runs", type=int, default=1,
                        help="servers of the plugin per mode, each compared with every stock run")
    parser.add_argument("--stock-runs", type=int, default=2,
                        help="servers of stock vLLM per mode (at least 2: stock's own share)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the reports of servers that finished in an earlier run "
                             "into the same --out, with the same settings (soak_store.py); "
                             "serve only the rest")
    args = parser.parse_args(argv)
    try:
        runs = run_tags(args.plugin_runs, args.stock_runs)
    except ValueError as e:
        parser.error(f"--plugin-runs/--stock-runs: {e}")
    if args.weights is None:
        args.weights = "random" if has_random_weights(args.shape) else "dummy"
    elif args.weights == "random" and not has_random_weights(args.shape):
        parser.error(f"--shape {args.shape} has no random checkpoint (MoE, or too big to "
                     "write); use --weights dummy")
    if args.structured and not args.sampling_mix:
        parser.error("--structured adds to the sampling mix: give --sampling-mix too")
    if bad := [g for g in args.gpus if len(g.split(",")) not in (1, args.pp)]:
        parser.error(f"--gpus {' '.join(bad)}: each group needs --pp ({args.pp}) GPUs, or one "
                     "GPU that every stage shares")
    modes = [m for m in args.modes.split(",") if m]
    servers = [(mode, *server) for mode in modes
               for server in mode_servers(mode, args.same_stock_mode, args.plugin_runner,
                                          args.plugin_runs, args.stock_runs)]
    saved = {(mode, tag): load_report(args.out, mode, tag, run_settings(args))
             for mode, _, _, tag in servers} if args.resume else {}
    args.out.mkdir(parents=True, exist_ok=True)
    slots = make_slots(args.gpus, args.servers_per_gpus, args.port, args.kv_cache_gib)
    model_root = tempfile.mkdtemp(prefix="soak-model-")
    if args.structured:
        model_dir = str(byte_vocab_model_dir(model_root, args.shape,
                                             weights=args.weights == "random"))
    else:
        model_dir = str(write_model_dir(model_root, args.shape, tokenizer=True,
                                        weights=args.weights == "random"))
    model_config = byte_vocab_config(args.shape) if args.structured else SHAPES[args.shape]
    extra = ["--distributed-executor-backend", "ray"] if args.ray else []
    extra += jit_monitor_args()
    if args.structured:
        extra += STRUCTURED_SERVE_ARGS
    args.lora_adapters = {
        f"lora{i}": write_lora_adapter(Path(model_dir) / "adapters" / f"lora{i}",
                                       model_config, seed=i + 1)
        for i in range(args.lora)}
    extra += lora_serve_args(args.lora_adapters)
    preemption = PREEMPTION_ARGS if args.preemption else []
    tasks = [resumed_task(mode, tag, saved[mode, tag]) if saved.get((mode, tag))
             else serve_task(mode, runner, run_mode, tag, args, model_dir, extra + preemption)
             for mode, runner, run_mode, tag in servers]
    if args.refusals:
        tasks += [lambda slot, r=refusal: refused_start(*r, model_dir, args.out, slot)
                  for refusal in REFUSALS]
        tasks += [lambda slot, m=model: refused_mismatch_model(*m, args.out, slot)
                  for model in MISMATCH_MODELS]
    if args.lowered_mode:
        tasks.append(lambda slot: lowered_mode_check(model_dir, args.out, slot, args))
    print(f"{len(tasks)} servers in {len(slots)} slots: "
          f"{', '.join(f'{s.gpus}:{s.port}' for s in slots)} {' '.join(extra + preemption)}",
          flush=True)
    reports = run_in_slots(tasks, slots)
    by_mode = [dict(zip(runs, reports[len(runs) * i:len(runs) * (i + 1)]))
               for i in range(len(modes))]
    checks = (run_in_slots([token_check_task(mode, mode_reports, args, model_dir)
                            for mode, mode_reports in zip(modes, by_mode)], slots)
              if args.token_check else [None] * len(modes))
    results = []
    for mode, mode_reports, check in zip(modes, by_mode, checks):
        result = mode_result(mode, mode_reports, args, extra + preemption)
        if check is not None:
            result["token_check"] = token_check_result(check, runs)
            result["problems"] += result["token_check"]["problems"]
            result["passed"] = not result["problems"]
        results.append(result)
        print(json.dumps({k: result.get(k) for k in
                          ("mode", "passed", "plugin_vs_stock", "stock_vs_stock",
                           "plugin_vs_plugin", "plugin_vs_stock_divergence_word",
                           "stock_vs_stock_divergence_word", "problems")}), flush=True)
    results += reports[len(runs) * len(modes):]
    (args.out / "soak.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
