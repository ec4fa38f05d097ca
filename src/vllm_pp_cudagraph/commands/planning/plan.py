"""``vllm-pp-cudagraph plan``: the layouts of a model on N GPUs that fit, each predicted."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm_pp_cudagraph.shared.vllm_surface import vllm_split
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, plan_engine
from vllm_pp_cudagraph.commands.planning.gpus import FITTED_ON, by_device_name
from vllm_pp_cudagraph.commands.planning.gpus import rates as gpu_rates
from vllm_pp_cudagraph.shared.layer_partition import Decision, Memory
from vllm_pp_cudagraph.commands.planning.measured import (
    MeasuredCell,
    host_bound_output,
    row_error,
    stock_calibration,
)
from vllm_pp_cudagraph.commands.planning.pipeline_model import (
    LINKS,
    STOCK_PP_GPU_FACTOR,
    Prediction,
    Workload,
    layout_name,
    pipeline,
    plugin_auto,
    tensor_parallel,
    tp_shard,
)
from vllm_pp_cudagraph.shared.stage_costs import (
    FITTED,
    ModelShape,
    Rates,
    stage_costs,
    unmodelled_reason,
)
from vllm_pp_cudagraph.shared.settings import LayerPartition, PPCudaGraphSettings


class PlanError(ValueError):
    """A plan that cannot be made: the message names what to change."""


@dataclass(frozen=True)
class Row:
    """One layout: its prediction, the KV tokens its cache holds, and whether it fits."""

    prediction: Prediction
    kv_tokens: int
    fits: bool
    why_not: str = ""


def _room(shape: ModelShape, split: tuple[int, ...], tp: int, memory: Memory) -> tuple[int, str]:
    """KV tokens the engine holds (its fullest GPU's), or 0 and why it does not fit."""
    costs = stage_costs(shape, 1)
    kv_per_layer = 2 * tp_shard(shape, tp).num_kv_heads * shape.head_dim * shape.dtype_bytes
    tokens = []
    for stage, layers in enumerate(split):
        weights = costs.stage_bytes(stage, len(split), layers) // tp
        room = memory.budget - weights
        if room <= 0:
            held = f"stage {stage}'s weights" if len(split) > 1 else "the weights"
            share = f", a 1/{tp} shard" if tp > 1 else ""
            return 0, (f"does not fit: {held} ({weights / 2**30:.1f} GiB per GPU{share}) "
                       f"leave no room in {memory.budget / 2**30:.1f} GiB")
        tokens.append(room // (layers * kv_per_layer))
    return min(tokens), ""


def planned_split(setting: LayerPartition, facts: EngineFacts,
                  gpu_memory_bytes: int | None) -> Decision:
    """The split an engine of ``facts`` uses under ``setting``, from the plan its own
    processes make (``check`` and ``plan`` show it)."""
    settings = PPCudaGraphSettings(layer_partition=setting)
    return plan_engine(settings, facts, gpu_memory_bytes).partition


def layouts(gpus: int) -> list[tuple[int, int]]:
    """(TP, PP) pairs over ``gpus``: PP=N, TP=N, and TP x PP with both above one."""
    both = [(tp, gpus // tp) for tp in range(2, gpus) if gpus % tp == 0]
    return [(1, gpus), (gpus, 1), *both]


def make_plan(config: Any, gpus: int, work: Workload, memory: Memory,
              interconnect: str = "nvlink",
              setting: LayerPartition = LayerPartition.VLLM,
              rates: Rates = FITTED,
              stock_factor: float = STOCK_PP_GPU_FACTOR) -> tuple[list[Row], Decision]:
    """Every layout of ``config`` over ``gpus`` GPUs of ``rates``, predicted for ``work``;
    and the split PP=``gpus`` uses (the decision ``check --model`` prints)."""
    if gpus < 2:
        raise PlanError(f"--gpus {gpus}: a plan compares layouts of at least 2 GPUs")
    if (reason := unmodelled_reason(config)) is not None:
        raise PlanError(f"this model cannot be predicted: {reason}")
    shape = ModelShape.from_config(config)
    if shape.num_layers < gpus:
        raise PlanError(f"--gpus {gpus}: the model has {shape.num_layers} decoder layers, "
                        f"fewer than the stages of PP={gpus}")
    link = LINKS[interconnect]
    rows, decision = [], None
    for tp, pp in layouts(gpus):
        if shape.num_kv_heads % tp or shape.num_heads % tp:
            skipped = Prediction(f"stock {layout_name(pp, tp)}",
                                 pp, tp, 0.0, 0.0, 0.0, ())
            why = (f"not possible: the model's {shape.num_heads} attention and "
                   f"{shape.num_kv_heads} KV heads do not divide by {tp}")
            rows.append(Row(skipped, 0, False, why))
            continue
        split = (shape.num_layers,)
        if pp > 1:
            facts = EngineFacts(pp, config, work.max_num_seqs,
                                gpu_memory_utilization=memory.utilization,
                                kv_cache_memory_bytes=memory.kv_cache_bytes)
            chosen = planned_split(setting, facts, memory.gpu_bytes)
            split = chosen.layers or vllm_split(shape.num_layers, pp)
            decision = decision or chosen
        kv, why = _room(shape, split, tp, memory)
        if pp == 1:
            predictions = [tensor_parallel(shape, tp, work, link, rates=rates)]
        else:
            predictions = [plugin_auto(shape, split, work, link, tp=tp, rates=rates),
                           pipeline(shape, split, work, "stock", link, tp=tp, rates=rates,
                                    stock_factor=stock_factor)]
        rows += [Row(at_api_ceiling(p, work), kv, not why, why) for p in predictions]
    return rows, decision


def at_api_ceiling(prediction: Prediction, work: Workload) -> Prediction:
    """``prediction`` held to the most output tokens/s a server with ``work.api_servers``
    API servers put out where they, not the GPUs, set the pace (a committed cell); as it
    is where no cell measured that bound or the GPUs are slower."""
    bound = host_bound_output(work.api_servers) if work.kind == "serve" else None
    if bound is None or prediction.output_tok_per_s <= bound[0]:
        return prediction
    share = bound[0] / prediction.output_tok_per_s
    # TPOT is left the GPUs' and no TTFT is given: where one API server held the 0.6B
    # cell, both the wait for a first token and the tokens after it grew, in a split the
    # model does not know.
    return replace(prediction, req_per_s=prediction.req_per_s * share,
                   output_tok_per_s=bound[0], api_ceiling=bound[0], ttft_s=None)


def _choices(rows: list[Row], work: Workload) -> list[Row]:
    """The layouts that fit and hold every running request's context (those that fit,
    where none holds them all)."""
    need = work.running * (work.input_len + work.output_len)
    return [r for r in rows if r.fits and r.kv_tokens >= need] or [r for r in rows if r.fits]


def recommended(rows: list[Row], work: Workload) -> Row | None:
    """The fastest layout that fits and holds every running request's context."""
    return max(_choices(rows, work), key=lambda r: r.prediction.req_per_s, default=None)


def bench_runner(prediction: Prediction) -> tuple[str, tuple[int, int]]:
    """The ``bench`` runner that measures ``prediction``'s layout, and the ``--pp``/``--tp``
    it runs under (runner ``tp`` spreads ``--pp`` x ``--tp`` GPUs by TP alone)."""
    if prediction.layout.startswith("plugin"):
        return "plugin", (prediction.pp, prediction.tp)
    if prediction.pp > 1:
        return "stock", (prediction.pp, prediction.tp)
    return "tp", (prediction.tp, 1)


def bench_commands(model: str, work: Workload, layouts: list[Prediction]) -> list[str]:
    """``bench`` invocations that measure ``layouts`` side by side (one where they share
    their ``--pp``/``--tp``, else one each), for ``work``'s load."""
    if work.prompts:
        load = f"--workload engine --prompts {work.prompts} --input-len {work.input_len}"
    else:
        load = f"--workload serve --points {work.input_len}:{work.concurrency}"
        if work.api_servers > 1:
            load += f" --api-server-count {work.api_servers}"
    runners = [bench_runner(p) for p in layouts]
    bases = {base for runner, base in runners if runner != "tp"} or {runners[0][1]}
    commands = []
    for pp, tp in sorted(bases):
        modes = ",".join(f"{runner}:full_and_piecewise" for runner, base in runners
                         if base == (pp, tp) or (runner == "tp" and base[0] == pp * tp))
        commands.append(f"vllm-pp-cudagraph bench --model {model} --weights dummy --pp {pp} "
                        f"--tp {tp} --max-num-seqs {work.max_num_seqs} {load} "
                        f"--output-len {work.output_len} --modes {modes}")
    return commands


def recommendation(rows: list[Row], work: Workload, model: str,
                   measured: list[MeasuredCell]) -> list[str]:
    """What ``plan`` recommends: a measured winner where a committed cell is this question,
    "too close to call" where the model cannot tell the best two layouts apart within their
    rows' errors, measured level or not (with the ``bench`` command that decides), else the
    fastest predicted layout."""
    best = recommended(rows, work)
    if best is None:
        return ["recommended: none (no layout fits: more GPUs, GPUs with more memory or a "
                "higher --gpu-memory-utilization)"]
    predicted = best.prediction.layout
    choices = sorted((r.prediction for r in _choices(rows, work)),
                     key=lambda p: p.req_per_s, reverse=True)
    # Where cells disagree, the one that measured the most layouts decides.
    if won := sorted((cell for cell in measured if cell.winner),
                     key=lambda cell: len(cell.req_per_s), reverse=True):
        why, contenders = _unmeasured_rival(won[0], choices, work.kind)
        if not contenders:
            note = "" if won[0].winner == predicted else f"; the model predicted {predicted}"
            return [f"recommended: {won[0].winner} (measured on {won[0].gpu}{note})"]
    elif measured:
        why, contenders = _measured_level(choices, measured, work.kind)
        if len(contenders) == 1:
            return [f"recommended: {contenders[0].layout} ({why})"]
    else:
        why, contenders = _predicted_close(choices, work.kind)
    if len(contenders) < 2:
        return [f"recommended: {predicted}"]
    first, second = sorted(contenders, key=lambda p: p.req_per_s, reverse=True)[:2]
    favours = (f"the model favours {first.layout}, by "
               f"{first.req_per_s / max(second.req_per_s, 1e-9) - 1:.0%} over {second.layout}")
    return [f"recommended: too close to call ({why}; {favours}); measure on your GPUs:",
            *(f"  {command}" for command in bench_commands(model, work, contenders))]


def _predicted_close(choices: list[Prediction], workload: str) -> tuple[str, list[Prediction]]:
    """The layouts (fastest first) predicted within the model's measured error of the
    fastest (for each pair, the larger of the two kinds' median errors under
    ``workload``), and why they are too close to call."""
    best = choices[0]
    contenders = [p for p in choices if _within_error(p, best, workload)]
    gap = contenders[0].req_per_s / max(contenders[-1].req_per_s, 1e-9) - 1
    error = max(_error(p, workload) for p in contenders)
    names = [p.layout for p in contenders]
    return (f"{', '.join(names[:-1])} and {names[-1]} are predicted within {gap:.0%} of "
            f"each other, inside the {error:.0%} the model was off at the median on "
            f"measured {workload} cells of these layouts", contenders)


def _within_error(prediction: Prediction, reference: Prediction, workload: str) -> bool:
    """Whether ``prediction`` is faster than ``reference`` or short of it by less than the
    larger of the two kinds' median errors under ``workload``: too close to tell apart."""
    error = max(_error(prediction, workload), _error(reference, workload))
    return prediction.req_per_s * (1 + error) > reference.req_per_s


def _error(prediction: Prediction, workload: str) -> float:
    """The model's median error on measured cells of ``prediction``'s kind of layout (the
    plugin's PP, stock PP or TP: the runner ``bench`` measures it with), ``workload`` and
    pace (host or GPUs)."""
    return row_error(bench_runner(prediction)[0], workload, prediction.host_paced)


def _unmeasured_rival(cell: MeasuredCell, choices: list[Prediction],
                      workload: str) -> tuple[str, list[Prediction]]:
    """Where a layout the winning ``cell`` did not measure is predicted within the model's
    error of its winner, or faster: why that leaves the choice open, and the winner and
    that rival to measure; else no contenders."""
    winner = next((p for p in choices if p.layout == cell.winner), None)
    rivals = [p for p in choices if p.layout not in cell.req_per_s and winner is not None
              and _within_error(p, winner, workload)]
    if not rivals:
        return "", []
    rival, beaten = rivals[0], [layout for layout in cell.req_per_s if layout != cell.winner]
    return (f"{cell.winner} won against {' and '.join(beaten)} on {cell.gpu}; {rival.layout}, "
            f"not measured at this load, is predicted at {rival.req_per_s / winner.req_per_s:.2f}x "
            f"it"), [winner, rival]


def _measured_level(choices: list[Prediction], measured: list[MeasuredCell],
                    workload: str) -> tuple[str, list[Prediction]]:
    """Why cells where every layout was level leave the choice open, and the layouts to
    measure: the best predicted of those measured against the best of those not, unless the
    model tells them apart beyond both rows' errors (then the faster, or the level pair)."""
    seen = list(dict.fromkeys(layout for cell in measured for layout in cell.req_per_s))
    tried = [p for p in choices if p.layout in seen]
    untried = [p for p in choices if p.layout not in seen]
    why = f"{' and '.join(seen)} measured level on {measured[0].gpu}"
    if not (tried and untried):
        return why, choices[:2]
    best, rival = tried[0], untried[0]
    unmeasured = f"{', '.join(p.layout for p in untried)} not measured at this load"
    if not _within_error(best, rival, workload):
        return (f"predicted {rival.req_per_s / best.req_per_s - 1:.0%} faster than "
                f"{best.layout}, beyond both rows' errors; {unmeasured}; {why}"), [rival]
    if not _within_error(rival, best, workload):
        return (f"{why}; {rival.layout} predicted {1 - rival.req_per_s / best.req_per_s:.0%} "
                f"slower, beyond both rows' errors"), tried[:2]
    return f"{why}; {unmeasured}", [best, rival]


def render(rows: list[Row], work: Workload, source: str, model: str = "MODEL",
           measured: list[MeasuredCell] = ()) -> list[str]:
    """The table ``plan`` prints, and the lines under it: the measured cells that are this
    question, the recommendation, and what the predictions rest on."""
    serve = work.kind == "serve"
    ttft_head = f" {'TTFT s':>6}" if serve else ""
    lines = [f"{'layout':<22} {'cadence':<8} {'req/s':>7} {'off by':>6} {'tok/s':>8} "
             f"{'TPOT ms':>8}{ttft_head} {'KV tokens':>10}  busy per GPU or stage"]
    for row in rows:
        p = row.prediction
        if not row.fits:
            lines.append(f"{p.layout:<22} {row.why_not}")
            continue
        busy = "/".join(f"{b:.0%}" for b in p.busy[:8])
        if p.api_ceiling:
            busy += " (held by the API servers)"
        off = f"±{_error(p, work.kind):.0%}"
        ttft = "" if not serve else f" {'-':>6}" if p.ttft_s is None else f" {p.ttft_s:>6.2f}"
        lines.append(f"{p.layout:<22} {p.cadence or '-':<8} {p.req_per_s:>7.2f} {off:>6} "
                     f"{p.output_tok_per_s:>8.0f} {p.tpot_s * 1e3:>8.1f}{ttft} "
                     f"{row.kv_tokens:>10,}  {busy}")
    lines += [cell.line() for cell in measured]
    lines += _api_ceiling_note(rows, work)
    lines += recommendation(rows, work, model, list(measured))
    best = recommended(rows, work)
    need = work.running * (work.input_len + work.output_len)
    if best and best.kv_tokens < need:
        lines.append(f"  its KV cache holds {best.kv_tokens:,} tokens, fewer than the "
                     f"{need:,} of {work.running} running requests: expect preemption")
    lines.append("off by: the model's median error on req/s over the measured cells of that "
                 f"layout and workload ({work.kind}), apart where the host, not the GPUs, "
                 "sets the step")
    lines.append(f"rests on: {source}. How far such predictions were off on measured "
                 "cells: docs/performance.md, 'Predicting PP against TP'")
    return lines


def _api_ceiling_note(rows: list[Row], work: Workload) -> list[str]:
    """Which served layouts the API servers' measured pace held, and how to lift it."""
    held = [r.prediction.layout for r in rows if r.fits and r.prediction.api_ceiling]
    if not held:
        return []
    tokens, cell = host_bound_output(work.api_servers)
    servers = f"{work.api_servers} API server{'s' if work.api_servers > 1 else ''}"
    return [f"  {', '.join(held)}: held to the {tokens:,.0f} output tokens/s {servers} put "
            f"out where they and the client, not the GPUs, set the pace ({cell.shape}, "
            f"{cell.gpu}, {cell.source}); more API servers (vllm serve --api-server-count, "
            "plan --api-server-count) lift that bound"]


#: The cadence each bench runner stands for, as ``bench`` sets it (``runner_cadence``);
#: "stock": stock MRV2's runner and cadence (V1 is predicted the same).
RUNNER_CADENCES = {"plugin": "auto", "plugin-merge": "merge", "plugin-balance": "balance",
                   "plugin-cadence": "vllm", "stock": "stock", "v1": "stock"}


def predict_run(config: Any, run: dict[str, Any]) -> Prediction | None:
    """The prediction for one bench run (its spec's fields; for ``serve`` also its point's
    ``concurrency``; ``interconnect`` where not NVLink) on the run's GPU (``gpu``, an H200
    where it names none) with stock PP calibrated for its release (``vllm_version``) and
    workload; None for a runner or a model it does not cover."""
    if unmodelled_reason(config) is not None:
        return None
    rates = gpu_rates(by_device_name(run.get("gpu") or "") or FITTED_ON)
    shape = ModelShape.from_config(config)
    serve = run["workload"] == "serve"
    work = Workload(run.get("concurrency") or run["prompts"], run["input_len"],
                    run["output_len"], run["max_num_seqs"], None if serve else run["prompts"],
                    run.get("api_servers") or 1)
    prediction = _run_prediction(shape, work, run, rates)
    return None if prediction is None else at_api_ceiling(prediction, work)


def _run_prediction(shape: ModelShape, work: Workload, run: dict[str, Any],
                    rates: Rates) -> Prediction | None:
    link = LINKS[run.get("interconnect") or "nvlink"]
    if run["runner"] == "tp":
        return tensor_parallel(shape, run["tp"] * run["pp"], work, link, rates=rates)
    cadence = run.get("cadence") or RUNNER_CADENCES.get(run["runner"])
    if cadence is None or run["pp"] < 2:
        return None
    split = tuple(run.get("layer_partition") or vllm_split(shape.num_layers, run["pp"]))
    if cadence == "auto":
        return plugin_auto(shape, split, work, link, tp=run["tp"], rates=rates)
    stock_factor = stock_calibration(run.get("vllm_version"), run["workload"]).factor
    return pipeline(shape, split, work, cadence, link, tp=run["tp"], rates=rates,
                    stock_factor=stock_factor)
