"""Serving soak: the plugin behind ``vllm serve`` against stock vLLM on the same requests.

For each graph mode the plugin serves the load once and stock (breakable against eager)
twice. The plugin is held to stock's own run-to-run differences (``soak_judge.py``): its
share of requests differing from stock, and with ``--token-check`` how far its tokens
fall below a scoring server's top choice. A plugin runner on another decode cadence than
vLLM's forms other batches by design; with ``--token-check`` the tokens alone judge it.
Every plugin run must also serve without errors, pass every health check, keep its graphs
within what it reserved, and shut down cleanly. Only tokens and health are judged here.

    python -m benchmarks.tools.soak --out DIR [--modes piecewise,...] [--pp N] [--gpus 0,1 2,3]
        [--shape qwen3-32b ...] [--weights random|dummy] [--gpu-memory-utilization U]
        [--lora N] [--sampling-mix [--structured]] [--preemption] [--token-check]
        [--refusals] (--modes "" --refusals: refusals only)
        [--plugin-runner plugin|plugin-cadence|plugin-kvsplit] [--resume]
"""

from __future__ import annotations

import argparse
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
    soak_verdict,
    structured_problems,
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
#: One mode's servers, and the pairs of them whose differing shares are compared.
RUNS = ("plugin", "stock_a", "stock_b")
PAIRS = {"plugin_vs_stock": [("plugin", "stock_a"), ("plugin", "stock_b")],
         "stock_vs_stock": [("stock_a", "stock_b")]}


def soak_prompts(count: int = 256) -> list[str]:
    """Prompts of 2..63 words (= tokens with the generated tokenizer)."""
    return [" ".join(token_word(1000 + (i * 131 + j * 17) % 140000) for j in range(2 + (i * 7) % 62))
            for i in range(count)]


def soak_load(args: argparse.Namespace) -> LoadSpec:
    """The soak's load: half the requests streamed, a tenth cancelled mid-stream, with
    ``--sampling-mix`` (and ``--structured``) the mix's sampling options, with ``--lora``
    some requests sent to an adapter."""
    mix = dict(SAMPLING_MIX) if args.sampling_mix else {}
    if args.structured:
        mix |= STRUCTURED_MIX
    if args.lora_adapters:
        mix = (mix or {"greedy": {}}) | lora_mix(args.lora_adapters)
    return LoadSpec("", "", soak_prompts(), args.requests, args.concurrency, args.max_tokens,
                    stream_fraction=0.5, cancel_fraction=0.1, sampling_mix=mix or None)


@dataclass(frozen=True)
class Slot:
    """Where one server runs: its GPUs and its port."""

    gpus: str
    port: int

    def apply(self, spec: RunSpec) -> RunSpec:
        env = dict(spec.extra_env, CUDA_VISIBLE_DEVICES=self.gpus,
                   VLLM_CACHE_ROOT=str(Path(tempfile.gettempdir()) / f"soak-cache-{self.port}"))
        return replace(spec, extra_env=env)


def run_in_slots(tasks: list[Callable[[Slot], dict]], slots: list[Slot],
                 stagger_s: float = 5.0) -> list[dict]:
    """Run each task in the next free slot; results in task order. Starts are spaced by
    ``stagger_s`` so that servers starting together do not race for the same free ports."""
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


def stock_mode_for(mode: str) -> str:
    """Stock's graph mode a plugin mode is compared with: breakable against eager."""
    return "eager" if mode == "breakable" else mode


def mode_servers(mode: str, plugin_runner: str = "plugin") -> list[tuple[str, str, str]]:
    """(runner, graph mode, run name) of the servers one mode's soak compares."""
    return [(plugin_runner, mode, "plugin"), ("stock", stock_mode_for(mode), "stock_a"),
            ("stock", stock_mode_for(mode), "stock_b")]


#: The model length of every server under --preemption, the token check's scorer included.
PREEMPTION_MODEL_LEN = ["--max-model-len", "2048"]
#: The KV cache of every server under --preemption: ~3,000 preemptions per 2,000 requests.
PREEMPTION_ARGS = ["--num-gpu-blocks-override", "512", *PREEMPTION_MODEL_LEN]


def missing_test_plugin(name: str) -> str | None:
    """Why a test plugin from ``tests/e2e/soak_plugins`` cannot load, or None."""
    if any(ep.name == name for ep in entry_points(group="vllm.general_plugins")):
        return None
    return f"test plugin {name} not installed: pip install tests/e2e/soak_plugins"


def server_spec(runner: str, run_mode: str, args: argparse.Namespace) -> RunSpec:
    """One soak server's engine: the soak's model shape, weights and memory share."""
    return RunSpec(runner, run_mode, pp=args.pp, max_num_seqs=args.max_num_seqs,
                   shape=args.shape, weights=args.weights,
                   gpu_memory_utilization=args.gpu_memory_utilization)


_STAGE_CAPTURE = re.compile(
    r"Worker_PP(\d+)\S*.*Graph capturing finished in [\d.]+ secs, took (\d+(?:\.\d+)?) GiB")

#: vLLM's log rounds both numbers to 0.01 GiB.
LOG_ROUNDING_GIB = 0.01


def graph_memory(log: str, records: Path) -> dict:
    """The plugin's CUDA-graph memory estimate per stage (its capture records in
    ``records``) beside what each stage's capture took (vLLM's log)."""
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
    cache was sized; none where vLLM measures graph memory itself (no estimate)."""
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
                                extra_args=extra, keep_texts=True, watch=watch)
        report["slot"] = {"gpus": slot.gpus, "port": slot.port}
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
        spec = slot.apply(server_spec("stock", stock_mode_for(mode), args))
        scorer_args = PREEMPTION_MODEL_LEN if args.preemption else []
        report = serve_and_call(spec, model_dir, args.out / f"{mode}-token-check.log", score_all,
                                port=slot.port, extra_args=scorer_args)
        checks = {name: report[name] for name in runs if name in report}
        scored = {name: (c.positions, c.not_first_choice, round(c.max_margin, 4))
                  for name, c in checks.items()}
        print(f"[{mode} token check] (tokens, not top choice, largest margin): {scored} "
              f"{report.get('error') or ''}", flush=True)
        return {"checks": checks, "error": report.get("error")}

    return task


def token_check_result(check: dict) -> dict:
    """Summaries and verdict of one mode's token check: the plugin against either stock run."""
    checks: dict[str, GreedyCheck] = check["checks"]
    missing = [name for name in RUNS if name not in checks]
    if check.get("error") or missing:
        why = check.get("error") or f"missing runs {missing}"
        return {"problems": [f"token check did not run: {why}"]}
    stock = max((checks["stock_a"], checks["stock_b"]), key=lambda c: c.max_margin)
    return {**{name: c.summary() for name, c in checks.items()},
            "problems": greedy_verdict(checks["plugin"], stock)}


def mode_result(mode: str, reports: dict[str, dict], args: argparse.Namespace,
                extra: list[str]) -> dict:
    """One mode's verdict from the reports of its runs (keys as :data:`RUNS` names them)."""
    result: dict = {"mode": mode, "pp": args.pp, "shape": args.shape, "weights": args.weights,
                    "lora": len(args.lora_adapters), "plugin_runner": args.plugin_runner,
                    "stock_mode": stock_mode_for(mode), "extra_args": extra,
                    "preemption": args.preemption, "requests": args.requests,
                    "structured": args.structured, "max_tokens": args.max_tokens}
    for name, rep in reports.items():
        result[name] = {k: rep.get(k) for k in ("load", "preemptions", "shutdown_rc",
                                                "shutdown_clean", "error", "slot", "graph_memory",
                                                "grammar_rejections", "jit_compiles")}
    if not all("load_report" in r for r in reports.values()):
        result["problems"] = [f"{name}: {rep.get('error')}" for name, rep in reports.items()
                              if "load_report" not in rep]
        result["passed"] = False
        return result
    texts = {name: rep["load_report"] for name, rep in reports.items()}
    for name, report in texts.items():
        result[name]["tpot_ms_by_phase"] = tpot_by_phase(report)
        result[name]["stalls"] = stream_stalls(report)
    # One comparison of 2,000 requests moves by several points from one run to the next:
    # the plugin's share is its mean against both stock runs.
    for kind, pairs in PAIRS.items():
        for x, y in pairs:
            result[f"{x}_vs_{y}"] = differing_share(texts[x], texts[y])
            result[f"{x}_vs_{y}_divergence_word"] = divergence_word(texts[x], texts[y])
        result[kind] = statistics.fmean(result[f"{x}_vs_{y}"] for x, y in pairs)
        result[f"{kind}_divergence_word"] = statistics.fmean(
            result[f"{x}_vs_{y}_divergence_word"] for x, y in pairs)
    # A plugin on another cadence than vLLM's forms other batches by design.
    shares_judge = runner_cadence(args.plugin_runner) == "vllm" or not args.token_check
    result["share_rule"] = "judges" if shares_judge else (
        "reported only: the plugin runner decodes on another cadence than stock, "
        "so its batches differ by design; the token check judges")
    plugin = reports["plugin"]
    problems = soak_verdict(plugin, result["plugin_vs_stock"], result["stock_vs_stock"],
                            shares_judge)
    problems += [f"plugin: {problem}"
                 for problem in graph_memory_problems(plugin.get("graph_memory"))]
    # Every run's watch is reported; only the plugin's judges, its first requests' memory
    # against stock_a's.
    result["watch"] = {name: {**(watch_summary(rep.get("watch")) or {}), "problems":
                              watch_problems(rep.get("watch"), name == "plugin",
                                             reports["stock_a"].get("watch"))}
                       for name, rep in reports.items()}
    problems += [f"plugin: {problem}" for problem in result["watch"]["plugin"]["problems"]]
    if args.structured:
        # Every run's structured outputs are checked; the plugin's must all pass.
        found = {name: structured_problems(rep) for name, rep in texts.items()}
        result["structured_checks"] = {
            name: {"checked": sum(structured(r.sampling) and r.completed
                                  for r in texts[name].results),
                   "problems": len(bad), "first": bad[:3]}
            for name, bad in found.items()}
        problems += [f"plugin: {problem}" for problem in found["plugin"][:5]]
        if plugin.get("grammar_rejections"):
            problems.append(f"plugin: the grammar rejected tokens "
                            f"{plugin['grammar_rejections']} times (log)")
    if args.preemption:
        problems += [f"{name}: no request was preempted (vllm:num_preemptions="
                     f"{rep.get('preemptions')}); lower --num-gpu-blocks-override"
                     for name, rep in reports.items() if not rep.get("preemptions")]
    result["problems"] = problems
    result["passed"] = not problems
    return result


def refused_start(name: str, env_overrides: dict, cli_extra: list[str], expect: str,
                  model_dir: str, out: Path, slot: Slot, timeout_s: float = 300,
                  weights: str = "random") -> dict:
    """Start a server that must refuse to start; check the message and leftovers."""
    spec = slot.apply(RunSpec("plugin", "piecewise", pp=2, weights=weights))
    env = engine_env(spec) | env_overrides
    log_path = out / f"refused-{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(spec, model_dir, slot.port, cli_extra), env=env,
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
    """Serve a model whose stages disagree on the tensors they exchange (from the
    test-only vLLM plugin ``pp_e2e_models``)."""
    missing = missing_test_plugin("pp_e2e_models")
    if missing:
        return {"case": case, "passed": False, "problem": missing}
    model_dir = write_model_dir(tempfile.mkdtemp(prefix=f"soak-{case}-"), tokenizer=True)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = [arch]
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    return refused_start(case, {"VLLM_PLUGINS": "pp_cudagraph,pp_e2e_models"}, [],
                         expect, str(model_dir), out, slot, weights="dummy")


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
                        help="per server (big shapes need more)")
    parser.add_argument("--port", type=int, default=8000, help="first slot's port (+10 per slot)")
    parser.add_argument("--pp", type=int, default=2, help="pipeline stages of every server")
    parser.add_argument("--gpus", nargs="+",
                        default=[os.environ.get("CUDA_VISIBLE_DEVICES") or "0,1"],
                        help="GPU groups, one server at a time on each: PP GPUs each, or one "
                             "that every stage shares (default: CUDA_VISIBLE_DEVICES)")
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
                             "matching sampling_mix.SCHEMA, and every structured output of the "
                             "plugin must parse and match, with no grammar rejection in its log; "
                             "the servers serve the shape with a byte-level vocabulary so its "
                             "grammar can spell JSON")
    parser.add_argument("--lora", type=int, default=0, metavar="N",
                        help="serve N seeded random LoRA adapters beside the base model "
                             "(--enable-lora); requests go to the base model or an adapter by "
                             "their seed, and only base-model greedy ones are token-checked")
    parser.add_argument("--refusals", action="store_true",
                        help="also check that bad settings, and models whose stages disagree, "
                             "refuse to start naming the setting and leave no process behind")
    parser.add_argument("--token-check", action=argparse.BooleanOptionalAction, default=False,
                        help="score every output token with a further stock server (soak_judge.py)")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the reports of servers that finished in an earlier run "
                             "into the same --out, with the same settings (soak_store.py); "
                             "serve only the rest")
    args = parser.parse_args(argv)
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
               for server in mode_servers(mode, args.plugin_runner)]
    saved = {(mode, tag): load_report(args.out, mode, tag, run_settings(args))
             for mode, _, _, tag in servers} if args.resume else {}
    args.out.mkdir(parents=True, exist_ok=True)
    slots = [Slot(gpus, args.port + 10 * i) for i, gpus in enumerate(args.gpus)]
    model_root = tempfile.mkdtemp(prefix="soak-model-")
    extra = list(jit_monitor_args())
    if args.structured:
        model_dir = str(byte_vocab_model_dir(model_root, args.shape,
                                             weights=args.weights == "random"))
        model_config = byte_vocab_config(args.shape)
        extra += STRUCTURED_SERVE_ARGS
    else:
        model_dir = str(write_model_dir(model_root, args.shape, tokenizer=True,
                                        weights=args.weights == "random"))
        model_config = SHAPES[args.shape]
    args.lora_adapters = {
        f"lora{i}": write_lora_adapter(Path(model_dir) / "adapters" / f"lora{i}",
                                       model_config, seed=i + 1)
        for i in range(args.lora)}
    extra += lora_serve_args(args.lora_adapters)
    if args.preemption:
        extra += PREEMPTION_ARGS
    tasks = [resumed_task(mode, tag, saved[mode, tag]) if saved.get((mode, tag))
             else serve_task(mode, runner, run_mode, tag, args, model_dir, extra)
             for mode, runner, run_mode, tag in servers]
    if args.refusals:
        tasks += [lambda slot, r=refusal: refused_start(*r, model_dir, args.out, slot)
                  for refusal in REFUSALS]
        tasks += [lambda slot, m=model: refused_mismatch_model(*m, args.out, slot)
                  for model in MISMATCH_MODELS]
    print(f"{len(tasks)} servers in {len(slots)} slots: "
          f"{', '.join(f'{s.gpus}:{s.port}' for s in slots)} {' '.join(extra)}", flush=True)
    reports = run_in_slots(tasks, slots)
    by_mode = [dict(zip(RUNS, reports[len(RUNS) * i:len(RUNS) * (i + 1)]))
               for i in range(len(modes))]
    checks = (run_in_slots([token_check_task(mode, mode_reports, args, model_dir)
                            for mode, mode_reports in zip(modes, by_mode)], slots)
              if args.token_check else [None] * len(modes))
    results = []
    for mode, mode_reports, check in zip(modes, by_mode, checks):
        result = mode_result(mode, mode_reports, args, extra)
        if check is not None:
            result["token_check"] = token_check_result(check)
            result["problems"] += result["token_check"]["problems"]
            result["passed"] = not result["problems"]
        results.append(result)
        print(json.dumps({k: result.get(k) for k in
                          ("mode", "passed", "plugin_vs_stock", "stock_vs_stock",
                           "plugin_vs_stock_divergence_word",
                           "stock_vs_stock_divergence_word", "problems")}), flush=True)
    results += reports[len(RUNS) * len(modes):]
    (args.out / "soak.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
