"""Run one vLLM engine configuration in a fresh process and report on it.

Each runner / graph-mode pair needs its own process: vLLM loads plugins once
per process and the breakable-graph switch is read when attention modules are
imported. :func:`run_in_subprocess` starts ``python -m
vllm_pp_cudagraph.commands.bench.engine_run`` with the right environment; the child builds
an offline ``LLM`` on a built-in model shape (seeded random weights, or vLLM's
dummy loader) or a given model, generates greedily with every request queued
before the first step, and prints one JSON report (timings, token digests).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.snapshots import (read_engine_snapshot, read_plan_records,
                                                 read_stage_snapshots)
from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.commands.bench.interconnect import INTERCONNECT_ENV, merge_options
from vllm_pp_cudagraph.commands.bench.nvidia_smi import query_visible_gpus
from vllm_pp_cudagraph.commands.bench.token_judge import record_of
from vllm_pp_cudagraph.commands.bench.trace_analysis import analyze_dir, stage_busy
from vllm_pp_cudagraph.commands.bench.stats import (
    RequestTiming,
    capture_stats,
    median_run,
    output_digest,
    spread_pct,
    summarize_requests,
)

#: Graph modes: engine keyword arguments and environment for each.
MODES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "eager": ({"enforce_eager": True}, {}),
    "piecewise": ({"compilation_config": {"cudagraph_mode": "PIECEWISE"}}, {}),
    "full_and_piecewise": (
        {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}},
        {},
    ),
    "full_decode_only": ({"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}, {}),
    "full": ({"compilation_config": {"cudagraph_mode": "FULL"}}, {}),
    "breakable": (
        {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
        {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"},
    ),
}

#: Runners: environment that selects each.
_PLUGIN = {"VLLM_PLUGINS": "pp_cudagraph", "VLLM_USE_V2_MODEL_RUNNER": "1"}
RUNNERS: dict[str, dict[str, str]] = {
    "plugin": _PLUGIN,
    # The plugin keeping vLLM's PP decode cadence: measures what the plugin's cadence gives.
    "plugin-cadence": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "vllm"},
    # The plugin filling only the steps that would be empty (the default before merging).
    "plugin-fill": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "fill"},
    # The plugin with every running request decoding at every step.
    "plugin-merge": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "merge"},
    # The plugin with requests in pp_size even groups that take turns.
    "plugin-balance": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "balance"},
    # The plugin where it would stand aside for a feature not yet proven with it.
    "plugin-unproven": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN": "1"},
    # The plugin handing tensors between stages without vLLM's per-step metadata.
    "plugin-direct": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF": "1"},
    # The plugin choosing the layer partition from the stages' predicted costs
    # (layer_partition.py); the split it used is the run's layer_partition_used.
    "plugin-auto-split": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_LAYER_PARTITION": "auto"},
    # The plugin without its per-stage metrics: what measuring the stages costs.
    "plugin-no-metrics": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_METRICS": "0"},
    # The plugin with vLLM's piecewise split at the KV-cache write.
    "plugin-kvsplit": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS": "0"},
    # Both: the plugin's runner and graphs with vLLM's schedule and vLLM's split.
    "plugin-cadence-kvsplit": {**_PLUGIN, "VLLM_PP_CUDAGRAPH_DECODE_CADENCE": "vllm",
                               "VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS": "0"},
    "stock": {"VLLM_PLUGINS": "", "VLLM_USE_V2_MODEL_RUNNER": "1"},
    "v1": {"VLLM_PLUGINS": "", "VLLM_USE_V2_MODEL_RUNNER": "0"},
    # Stock MRV2 on the same GPUs by tensor parallelism alone (see runner_layout).
    "tp": {"VLLM_PLUGINS": "", "VLLM_USE_V2_MODEL_RUNNER": "1"},
}

#: Runners for the project's own checks, accepted by --modes but not listed in --help.
INTERNAL_RUNNERS = frozenset({"plugin-cadence-kvsplit", "plugin-unproven", "plugin-no-metrics"})

#: Runners that spread the model over all the GPUs by tensor parallelism, without stages.
TENSOR_PARALLEL_RUNNERS = frozenset({"tp"})


def runner_layout(runner: str, pp: int, tp: int) -> tuple[int, int]:
    """(pipeline, tensor) parallel sizes ``runner`` runs at for ``--pp pp --tp tp``:
    on the same pp * tp GPUs whichever the runner."""
    return (1, pp * tp) if runner in TENSOR_PARALLEL_RUNNERS else (pp, tp)


def runner_cadence(runner: str) -> str | None:
    """The decode cadence ``runner`` runs the plugin with (``auto`` unless it sets one);
    None for runners without the plugin."""
    env = RUNNERS[runner]
    if env.get("VLLM_PLUGINS") != _PLUGIN["VLLM_PLUGINS"]:
        return None
    return env.get("VLLM_PP_CUDAGRAPH_DECODE_CADENCE", "auto")


#: Greedy outputs agree within a family: compiled graphs share one numeric
#: path, eager and breakable (no torch.compile) another.
TOKEN_FAMILY = {
    "eager": "eager",
    "breakable": "eager",
    "piecewise": "compiled",
    "full_and_piecewise": "compiled",
    "full_decode_only": "compiled",
    "full": "compiled",
}

@dataclass
class RunSpec:
    """One engine configuration and workload."""

    runner: str
    mode: str
    pp: int = 2
    tp: int = 1
    """Tensor-parallel size inside each pipeline stage: the engine uses pp * tp GPUs."""
    layer_partition: list[int] | None = None
    """Layers per pipeline stage (vLLM's ``VLLM_PP_LAYER_PARTITION``); None: vLLM's split."""
    speculative_config: dict[str, Any] | None = None
    """vLLM's ``speculative_config`` (``{"method": ...}``); None: no speculative decoding."""
    prompts: int = 128
    input_len: int = 2
    output_len: int = 512
    output_len_spread: int = 0
    """If above 0, requests ask for up to this many tokens fewer than output_len, so
    they finish at different steps; with more prompts than max_num_seqs, queued
    requests are then admitted one by one and their prefills share batches with
    decodes. Whether the schedule then depends on the workload alone, not on
    timing, shows in the bench's check that every pass repeats its tokens."""
    max_num_seqs: int = 128
    workload: str = "batch"
    """"batch": every request queued with the scheduler paused, one batch (tokens
    comparable across runners); "engine": ``LLM.generate`` as users call it, the
    engine stepping while requests arrive; "serve": ``vllm serve`` driven by
    ``vllm bench serve``."""
    repeat: int = 1
    shape: str = "qwen3-0.6b"
    model: str | None = None
    weights: str = "random"
    """"random": seeded random checkpoint for built-in shapes (outputs depend on
    every layer); "dummy": vLLM's dummy loader (faster start, weak token checks)."""
    attention_backend: str | None = "TRITON_ATTN"
    """vLLM's attention backend by name; None leaves the choice to vLLM."""
    gpu_memory_utilization: float = 0.5
    kv_transfer_config: dict[str, Any] | None = None
    """vLLM's ``kv_transfer_config`` (``{"kv_connector": ...}``); None: no KV connector."""
    async_scheduling: bool | None = None
    """vLLM's ``async_scheduling``; None: vLLM's choice."""
    max_model_len: int | None = None
    """vLLM's ``max_model_len``; None: the model's."""
    deterministic_compile: bool = False
    """Inductor's deterministic mode: compiled kernels chosen without timing them, so
    engines built alike run the same kernels (see :func:`mode_options`)."""
    logprobs: int = 0
    """Top logprobs recorded per output position (0: none)."""
    tokens_file: str | None = None
    """If set: the warm-up's tokens and logprobs are written here (a TokenRecord)."""
    profile_dir: str | None = None
    """If set: after the timed runs, one more pass under torch.profiler, traces here."""
    interconnect: str = "nvlink"
    """The link between GPUs simulated (:mod:`~vllm_pp_cudagraph.commands.bench.interconnect`)."""
    executor: str | None = None
    """vLLM's ``distributed_executor_backend`` ("mp", "ray"); None: vLLM's choice."""
    api_servers: int = 1
    """``vllm serve --api-server-count``: API-server processes in front of the engine."""
    max_capture_size: int | None = None
    """``compilation_config.max_cudagraph_capture_size``: the largest batch captured as a
    CUDA graph; None: vLLM's (2 x ``max_num_seqs``, at most 512)."""
    request_rate: float | None = None
    """``vllm bench serve --request-rate``: requests arrive as a Poisson process at this
    rate per second, at most the point's concurrency in flight; None: a closed loop."""
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.runner}:{self.mode}"


def gpu_model() -> str | None:
    """Model name of the NVIDIA GPUs this process may use (distinct names joined), or None."""
    names = dict.fromkeys(query_visible_gpus("name") or [])
    return ", ".join(names) or None


@functools.cache
def run_environment() -> dict[str, str | None]:
    """The vLLM and torch the engines run (the bench starts them with its own
    interpreter) and the GPU model they run on."""
    versions = vllm_surface.installed_versions()
    return {"vllm_version": versions.vllm, "torch_version": versions.torch, "gpu": gpu_model()}


def spec_record(spec: RunSpec) -> dict[str, Any]:
    """``spec`` as a report records it: with the vLLM, torch and GPU it ran on."""
    return {**asdict(spec), **run_environment()}


def make_prompts(count: int, length: int, vocab: int = 151936, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, vocab - 1000) for _ in range(length)] for _ in range(count)]


def output_lengths(spec: RunSpec) -> list[int]:
    """Each request's output length: output_len, less a spread that varies by request."""
    if spec.output_len_spread <= 0:
        return [spec.output_len] * spec.prompts
    if spec.output_len_spread >= spec.output_len:
        raise ValueError(f"output_len_spread={spec.output_len_spread} must be below "
                         f"output_len={spec.output_len}")
    return [spec.output_len - (i * 37) % (spec.output_len_spread + 1) for i in range(spec.prompts)]


def child_model_dir(spec: RunSpec) -> str:
    """The model the child loads: ``spec.model``, else the built-in shape written out.

    One directory per shape and weights, shared by every engine started this way:
    the 1.2 GB checkpoint is written once, not once per engine.
    """
    if spec.model is not None:
        return spec.model
    cache = Path(tempfile.gettempdir()) / f"vllm-pp-cudagraph-{spec.shape}-{spec.weights}"
    return str(write_model_dir(cache, spec.shape, weights=spec.weights == "random"))


def start_engine(spec: RunSpec) -> tuple[Any, float]:
    """vLLM's ``LLM`` for ``spec`` and the seconds it took to start."""
    from vllm import LLM

    kwargs = engine_kwargs(spec, child_model_dir(spec))
    if spec.profile_dir:
        from vllm.config import ProfilerConfig

        kwargs["profiler_config"] = ProfilerConfig(**profiler_settings(spec.profile_dir))
    start = time.perf_counter()
    llm = LLM(**kwargs)
    return llm, time.perf_counter() - start


def empty_prefix_cache(llm, tries: int = 50, wait_s: float = 0.1) -> bool:
    """Empty vLLM's prefix cache before a pass; whether it was emptied.

    Every pass sends the same prompts (each engine's tokens are compared pass by pass),
    and vLLM caches prefixes by default: a pass after the first would otherwise find its
    prompts cached and skip most of its prefill. vLLM refuses while a finished request's
    blocks are still held, so it is asked again for a few seconds."""
    for _ in range(tries):
        if llm.reset_prefix_cache():
            return True
        time.sleep(wait_s)
    return False


def timed_pass(llm, spec: RunSpec, prompts: list, params: list) -> tuple[dict[str, Any], list]:
    """One pass over the workload: its elapsed seconds and request latencies, and outputs."""
    t0 = time.perf_counter()
    if spec.workload == "batch":
        outs = generate_as_one_batch(llm, prompts, params)
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    timings = [
        RequestTiming(
            o.metrics.first_token_latency,
            o.metrics.first_token_ts,
            o.metrics.last_token_ts,
            o.metrics.num_generation_tokens,
        )
        for o in outs
        if o.metrics is not None
    ]
    return {"elapsed_s": round(elapsed, 4), **summarize_requests(timings)}, outs


def tokens_of(outs: list) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def _child(spec: RunSpec) -> dict[str, Any]:
    """Start the engine, warm it up, time ``spec.repeat`` passes (one more profiled)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, init_s = start_engine(spec)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in make_prompts(spec.prompts, spec.input_len)]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                             logprobs=spec.logprobs or None)
              for n in output_lengths(spec)]
    warmup, outputs = timed_pass(llm, spec, prompts, params)
    if spec.tokens_file:
        record_of(outputs).save(Path(spec.tokens_file))
    runs, run_digests, emptied = [], [], []
    for _ in range(spec.repeat):
        emptied.append(empty_prefix_cache(llm))
        run, outs = timed_pass(llm, spec, prompts, params)
        runs.append(run)
        run_digests.append(output_digest(tokens_of(outs)))
    if spec.profile_dir:
        emptied.append(empty_prefix_cache(llm))
        llm.start_profile()
        timed_pass(llm, spec, prompts, params)
        llm.stop_profile()
    return {
        **child_report(spec, init_s, warmup, runs, tokens_of(outputs)),
        # the same engine must repeat its own tokens once batches are formed alike
        "run_digests": run_digests,
        # False where a pass after the warm-up may have found its prompts cached
        "prefix_cache_emptied": all(emptied),
        "spec_decode": spec_decode_stats(llm.get_metrics()) if spec.speculative_config else None,
    }


def child_report(spec: RunSpec, init_s: float, warmup: dict[str, Any],
                 runs: list[dict[str, Any]], tokens: list[list[int]]) -> dict[str, Any]:
    """The child's numbers: the median timed pass (else the warm-up) and the warm-up's tokens."""
    chosen = median_run(runs) if runs else warmup
    return {
        "request_digests": [output_digest([t])[:8] for t in tokens],
        "spec": asdict(spec),
        "init_s": round(init_s, 2),
        "warmup": warmup,
        "runs": runs,
        "req_per_s": round(spec.prompts / chosen["elapsed_s"], 2),
        "spread_pct": spread_pct(runs),
        "output_tok_per_s": round(sum(map(len, tokens)) / chosen["elapsed_s"], 1),
        **{k: round(v, 3) for k, v in chosen.items() if k != "elapsed_s"},
        "digest": output_digest(tokens),
        "num_output_tokens": sum(map(len, tokens)),
    }


def engine_kwargs(spec: RunSpec, model: str) -> dict[str, Any]:
    """``LLM(...)``'s keyword arguments for ``spec`` on ``model`` (profiler config aside)."""
    kwargs: dict[str, Any] = {
        "model": model,
        "load_format": "dummy" if spec.weights == "dummy" else "auto",
        "skip_tokenizer_init": True,
        "pipeline_parallel_size": spec.pp,
        "tensor_parallel_size": spec.tp,
        "max_num_seqs": spec.max_num_seqs,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "seed": 0,
        "disable_log_stats": False,  # per-request timestamps for TTFT / TPOT
        **mode_options(spec),
    }
    if spec.attention_backend:
        kwargs["attention_backend"] = spec.attention_backend
    if spec.speculative_config:
        kwargs["speculative_config"] = spec.speculative_config
    if spec.kv_transfer_config:
        kwargs["kv_transfer_config"] = spec.kv_transfer_config
    if spec.async_scheduling is not None:
        kwargs["async_scheduling"] = spec.async_scheduling
    if spec.max_model_len is not None:
        kwargs["max_model_len"] = spec.max_model_len
    if spec.executor is not None:
        kwargs["distributed_executor_backend"] = spec.executor
    return kwargs


def mode_options(spec: RunSpec) -> dict[str, Any]:
    """The engine options of ``spec``'s graph mode, with Inductor's deterministic mode
    where ``spec.deterministic_compile`` asks for it and ``spec.max_capture_size``.

    Inductor otherwise picks some compiled kernels (reduction block sizes, vLLM's
    combined kernels) by timing candidates on the GPU as the engine starts. Candidates
    that sum in another order round differently, so two engines built alike can run
    different kernels and part at near-tied greedy tokens. A mode without compilation
    (eager) is unchanged.
    """
    options = dict(MODES[spec.mode][0])
    compilation = dict(options.get("compilation_config", {}))
    if spec.deterministic_compile:
        compilation["inductor_compile_config"] = {"deterministic": True}
    if spec.max_capture_size is not None:
        compilation["max_cudagraph_capture_size"] = spec.max_capture_size
    if compilation and not options.get("enforce_eager"):
        options["compilation_config"] = compilation
    return merge_options(options, spec.interconnect)


#: vLLM's speculative-decoding counters, summed over engines, and what they count.
SPEC_DECODE_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


def spec_decode_stats(metrics: list) -> dict[str, Any] | None:
    """Acceptance of speculative decoding from ``LLM.get_metrics()``; None without drafts.

    ``acceptance_rate`` is accepted over drafted tokens, ``mean_acceptance_length``
    the tokens each step gives (1 + accepted per draft), ``per_position`` each draft
    position's share of drafts accepted. Counted over every pass, warm-up included.
    """
    counts = dict.fromkeys(SPEC_DECODE_COUNTERS.values(), 0)
    per_pos: list[int] = []
    for metric in metrics:
        if metric.name in SPEC_DECODE_COUNTERS:
            counts[SPEC_DECODE_COUNTERS[metric.name]] += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            values = list(metric.values)
            per_pos = [a + b for a, b in zip(per_pos, values)] if per_pos else values
    if not counts["drafts"] or not counts["draft_tokens"]:
        return None
    return {
        **counts,
        "acceptance_rate": round(counts["accepted_tokens"] / counts["draft_tokens"], 4),
        "mean_acceptance_length": round(1 + counts["accepted_tokens"] / counts["drafts"], 3),
        "per_position": [round(n / counts["drafts"], 4) for n in per_pos],
    }


def generate_as_one_batch(llm, prompts: list, params) -> list:
    """``llm.generate``, but every request is queued before the first step.

    The engine core runs in its own process and starts scheduling as soon as
    the first request arrives, so plain ``generate`` splits the prompts over
    the first steps by timing. Different batches round differently, and with
    weights that make outputs sensitive, greedy tokens then differ from run to
    run of the same engine. Pausing the scheduler (vLLM's sleep level 0) while
    queueing makes the batches, and so the tokens, the same on every run.
    """
    llm.sleep(level=0)
    try:
        llm.enqueue(prompts, params, use_tqdm=False)
    finally:
        llm.wake_up(tags=["scheduling"])
    return llm.wait_for_completion(use_tqdm=False)


def engine_env(spec: RunSpec) -> dict[str, str]:
    """This process's environment, set up for ``spec``'s runner and mode."""
    _, mode_env = MODES[spec.mode]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PP_CUDAGRAPH_")}
    env.pop("VLLM_USE_BREAKABLE_CUDAGRAPH", None)
    env.update(RUNNERS[spec.runner])
    env.update(mode_env)
    env.pop("VLLM_PP_LAYER_PARTITION", None)  # the spec's split, or vLLM's: as recorded
    if spec.layer_partition:
        env["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, spec.layer_partition))
    env.pop("TORCHINDUCTOR_DETERMINISTIC", None)
    if spec.deterministic_compile:
        env["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    env.update(INTERCONNECT_ENV[spec.interconnect])
    env.update(spec.extra_env)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    return env


def profiler_settings(profile_dir: str) -> dict[str, Any]:
    """vLLM's profiler config for a profiled pass: torch.profiler traces, without stacks."""
    return {"profiler": "torch", "torch_profiler_dir": profile_dir,
            "torch_profiler_with_stack": False}


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10) -> None:
    """SIGABRT (each Python process writes its stack), then SIGKILL."""
    for sig, grace in ((signal.SIGABRT, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        time.sleep(grace)
    proc.wait()


#: vLLM's JIT monitor line, its process and time where the log's prefix has them.
_SERVING_JIT = re.compile(
    r"^(?:\((?P<process>[^ )]+)[^)\n]*\) )?(?:\w+ (?P<time>\d\d-\d\d \d\d:\d\d:\d\d) )?"
    r".*?JIT compilation during inference: (?P<kernel>\w+)", re.MULTILINE)


def serving_jit_events(log: str) -> list[dict]:
    """Each kernel vLLM's JIT monitor saw compiled while serving, in order: process, time
    and kernel. The monitor logs only a kernel's first compile on the first rank, unless
    vLLM runs with ``--jit-monitor-verbose``."""
    return [match.groupdict() for match in _SERVING_JIT.finditer(log)]


def serving_jit_compiles(log: str) -> list[str]:
    """Kernels compiled while serving, in order, by vLLM's JIT monitor: each a latency spike."""
    return [event["kernel"] for event in serving_jit_events(log)]


# Asked for: "Using AttentionBackendEnum.TRITON_ATTN backend."; vLLM's choice: "Using
# FLASH_ATTN attention backend out of potential backends: [...]".
_ATTENTION_BACKEND = re.compile(
    r"Using (?:AttentionBackendEnum\.(\w+) backend|(\w+) attention backend)")


def attention_backend_used(log: str) -> str | None:
    """The attention backends vLLM logged it uses (distinct, joined), or None."""
    names = dict.fromkeys(a or b for a, b in _ATTENTION_BACKEND.findall(log))
    return ", ".join(names) or None


def records_dir_of(log_path: Path) -> Path:
    """Where a run's processes leave their plan records and metrics: beside its log."""
    return log_path.with_name(log_path.name + ".records")


def records_dir(log_path: Path) -> Path:
    """:func:`records_dir_of`, emptied for a new run."""
    directory = records_dir_of(log_path)
    shutil.rmtree(directory, ignore_errors=True)
    return directory


#: What bench.json keeps of each stage's last metrics snapshot.
STAGE_METRIC_KEYS = ("window_s", "steps", "busy_fraction", "wait_fraction", "step_ms",
                     "graph_steps_total", "eager_steps_total", "handoff_bytes_total")


#: What bench.json keeps of the engine core's last cadence snapshot.
ENGINE_METRIC_KEYS = ("cadence", "cadence_switches_total", "cadence_trials_total",
                      "cadence_trial_steps_total", "cadence_wide_losses_total", "group_sizes",
                      "running_reqs", "recent_trials")


#: What a run without any plan record ran: vLLM alone (stock, V1), or a plugin run that
#: stopped before its ranks built their runners.
NO_RECORDS = {"plugin_stages": 0, "stand_aside_ranks": 0, "direct_handoff_stages": 0,
              "layer_partition_used": None, "plan_records": 0, "cadence_choices": []}


def record_findings(directory: Path) -> dict[str, Any]:
    """What the run's ranks and engine core recorded (shared/snapshots.py): the ranks on
    the plugin's runner and on vLLM's, their hand-off and split, each stage's and the engine
    core's last metrics."""
    ranks = [r for name, r in read_plan_records(directory).items()
             if not name.startswith("engine")]
    if not ranks:
        return dict(NO_RECORDS)
    first = next((r for r in ranks if (r.get("stage"), r.get("tp_rank")) == (0, 0)), {})
    stages = read_stage_snapshots(0, directory, max_age_s=math.inf)
    engine = read_engine_snapshot(0, directory, max_age_s=math.inf)
    return {
        "plugin_stages": sum(1 for r in ranks if r.get("plugin_runner")),
        "stand_aside_ranks": sum(1 for r in ranks if not r.get("plugin_runner")),
        "direct_handoff_stages": sum(1 for r in ranks if r.get("direct_handoff")),
        "layer_partition_used": first.get("layers") if first.get("split_noteworthy") else None,
        "plan_records": len(ranks),
        "cadence_choices": [] if engine is None else list(engine.cadences_adopted),
        # Each stage's last metrics window (the one /metrics showed last), where it wrote one.
        "stage_metrics": {stage: {key: getattr(snap, key) for key in STAGE_METRIC_KEYS}
                          for stage, snap in sorted(stages.items())},
        # The engine core's last cadence snapshot: the cadence in effect and auto's trials.
        "engine_metrics": None if engine is None else
        {key: getattr(engine, key) for key in ENGINE_METRIC_KEYS},
    }


def log_findings(log: str) -> dict[str, Any]:
    """What vLLM's own log lines say beyond the numbers (the plugin's facts come from its
    records: :func:`record_findings`)."""
    return {
        "jit_compiles": serving_jit_compiles(log),
        "attention_backend_used": attention_backend_used(log),
    }


def run_in_subprocess(
    spec: RunSpec, log_path: Path, timeout_s: float | None = None
) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; return its report.

    The child's output streams to ``log_path``. If it outlives ``timeout_s``,
    every process it started gets SIGABRT first, so that Python's fault
    handler writes each one's stack to the log (that is where a hang shows),
    then SIGKILL.
    """
    env = engine_env(spec)
    records = env["VLLM_PP_CUDAGRAPH_METRICS_DIR"] = str(records_dir(log_path))
    cmd = [sys.executable, "-m", "vllm_pp_cudagraph.commands.bench.engine_run", "--child", json.dumps(asdict(spec))]
    timed_out = False
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_process_group(proc)
    log = log_path.read_text(errors="replace")
    report: dict[str, Any] = {"spec": asdict(spec), "returncode": proc.returncode}
    if timed_out:
        report["timed_out_after_s"] = timeout_s
    for line in reversed(log.splitlines()):
        if line.startswith("{") and '"digest"' in line:
            report.update(json.loads(line))
            break
    else:
        report["error_tail"] = log[-3000:]
    report.update(capture_stats(log))
    report.update(log_findings(log))
    report.update(record_findings(Path(records)))
    report["spec"] = spec_record(spec)
    if spec.profile_dir and Path(spec.profile_dir).is_dir():
        report["profile"] = analyze_dir(Path(spec.profile_dir))
        report["gpu_busy_pct"] = stage_busy(report["profile"])
    return report


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``python -m vllm_pp_cudagraph.commands.bench.engine_run --child SPEC``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", required=True, help="RunSpec as JSON")
    args = parser.parse_args(argv)
    print(json.dumps(_child(RunSpec(**json.loads(args.child)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
