"""What PP with the plugin, stock PP and TP deliver for a model on N GPUs, predicted.

From stage costs (:mod:`vllm_pp_cudagraph.shared.stage_costs`) and how each layout's steps
overlap; docs/performance.md ("Predicting PP against TP") says how and how far it holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.resources import files

from vllm_pp_cudagraph.shared.stage_costs import (
    FITTED,
    ModelShape,
    Rates,
    StageCosts,
    find_table,
    modelled_costs,
    stage_costs,
    table_costs,
)

#: Host time of one engine step, fitted to a host-bound 0.6B stage at PP=1 on one H200.
HOST_STEP_S = 1.4e-3
HOST_PER_REQUEST_S = 18e-6
#: The same step's fixed part under ``vllm serve``, where the engine core also takes
#: requests from the API servers and streams their outputs back: the median over the
#: host-paced steps of the served 0.6B cells (PP=2, 32-512 requests a step).
SERVE_HOST_STEP_S = 2.6e-3
#: TTFT p50 under ``serve`` over one prefill of the running requests' prompts at the
#: model's rates, fitted on the served 32B cells (benchmarks/results/2026-11-27-plan-check-ttft-cpu).
TTFT_P50_SHARE = 0.69
#: Under ``serve``, the time per request a closed loop's wave of new requests waits to be
#: taken in (API servers and engine core), where that is longer than their prefills, by
#: ``--api-server-count``: TTFT p50 over ``TTFT_P50_SHARE`` x the requests running, the
#: median over the served runs with one API server (36 runs of the 32B shape, quartiles
#: 3.4-3.9 ms) and with four (32 runs of the 0.6B and 4B shapes, quartiles 1.02-1.27 ms).
SERVE_INTAKE_S = {1: 3.7e-3, 4: 1.2e-3}
#: Stock MRV2's GPU time per PP step over the plugin's at the same group size, as measured
#: on vLLM 0.26 (``plan`` takes the installed release's from measured_cells.json).
STOCK_PP_GPU_FACTOR = 1.31


#: The largest message vLLM's own all-reduce over NVLink (its custom or symmetric-memory
#: one, both peer-to-peer) takes on Hopper, by TP size (vLLM's all_reduce_utils); a larger
#: one, or one off NVLink, runs NCCL's ring.
P2P_ALL_REDUCE_MAX_BYTES = {2: 64 << 20, 4: 32 << 20, 6: 1 << 19, 8: 1 << 18}
#: Below this, or over two GPUs, that all-reduce is one shot: each GPU reads every peer's
#: whole input; above it, a reduce-scatter and an all-gather.
P2P_ONE_SHOT_MAX_BYTES = 1 << 19
#: One such all-reduce's latency inside a CUDA graph: a kernel with a barrier over the peers.
P2P_ALL_REDUCE_LATENCY_S = 6e-6


@dataclass(frozen=True)
class Link:
    """A link between GPUs: what one transfer or all-reduce of ``n`` bytes costs."""

    bytes_per_s: float
    latency_s: float
    all_reduce_bytes_per_s: float
    """NCCL's ring all-reduce's bus bandwidth."""
    all_reduce_latency_s: float
    peer_to_peer: bool = False
    """Whether vLLM's TP all-reduces run peer to peer over it (NVLink) rather than on NCCL."""

    def transfer_s(self, n: float) -> float:
        return self.latency_s + n / self.bytes_per_s

    def all_reduce_s(self, n: float, ranks: int) -> float:
        """NCCL's ring all-reduce of ``n`` bytes over ``ranks`` GPUs."""
        return self.all_reduce_latency_s + 2 * (ranks - 1) / ranks * n / self.all_reduce_bytes_per_s

    def tp_all_reduce_s(self, n: float, ranks: int) -> float:
        """A TP all-reduce of ``n`` bytes as vLLM runs it: peer to peer where it can, each GPU
        reading its peers' inputs at the link's copy bandwidth, else NCCL's ring."""
        if not self.peer_to_peer or n > P2P_ALL_REDUCE_MAX_BYTES.get(ranks, 0):
            return self.all_reduce_s(n, ranks)
        one_shot = ranks == 2 or n <= P2P_ONE_SHOT_MAX_BYTES
        read = (ranks - 1) * n if one_shot else 2 * (ranks - 1) / ranks * n
        return P2P_ALL_REDUCE_LATENCY_S + read / self.bytes_per_s


#: An all-reduce's latency inside a CUDA graph, where TP's run (documented values): the
#: link bench times one from Python, launch and synchronize included, which a graph has not.
IN_GRAPH_ALL_REDUCE_LATENCY_S = {"nvlink": 10e-6, "host": 25e-6, "socket": 60e-6}


def _measured_links() -> dict[str, Link]:
    """The links of links.json (``--interconnect``'s names: bench/interconnect.py), as the
    link bench measured them on 2 GPUs of one host."""
    table = json.loads(files(__package__).joinpath("links.json").read_text())["links"]
    return {name: Link(bytes_per_s=ops["send_recv"]["bytes_per_s"],
                       latency_s=ops["send_recv"]["latency_s"],
                       all_reduce_bytes_per_s=ops["all_reduce"]["bytes_per_s"],
                       all_reduce_latency_s=IN_GRAPH_ALL_REDUCE_LATENCY_S[name],
                       peer_to_peer=name == "nvlink")
            for name, ops in table.items()}


LINKS = _measured_links()


@dataclass(frozen=True)
class Workload:
    """Requests as an engine sees them: ``concurrency`` in flight (``vllm bench serve
    --max-concurrency``), or, with ``prompts``, an offline batch of that many."""

    concurrency: int
    input_len: int
    output_len: int
    max_num_seqs: int = 256
    prompts: int | None = None
    api_servers: int = 1
    """``vllm serve --api-server-count``: the processes that stream the outputs."""

    @property
    def running(self) -> int:
        """Requests decoding at once."""
        limit = self.concurrency if self.prompts is None else self.prompts
        return max(1, min(limit, self.max_num_seqs))

    @property
    def mean_context(self) -> float:
        return self.input_len + self.output_len / 2

    @property
    def prefill_per_round(self) -> float:
        """Prompt tokens prefilled while every running request decodes one token: under
        ``serve`` (a closed loop) ``running / output_len`` requests end and as many start
        each such round, their prefills riding in the decode steps; an offline batch
        prefills before it decodes."""
        return 0.0 if self.prompts else self.running * self.input_len / self.output_len

    @property
    def kind(self) -> str:
        """``engine`` for an offline batch, ``serve`` for requests at a concurrency."""
        return "engine" if self.prompts else "serve"


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted delivery."""

    layout: str
    pp: int
    tp: int
    tpot_s: float
    req_per_s: float
    output_tok_per_s: float
    busy: tuple[float, ...]
    """Each GPU's busy fraction (each stage's under PP)."""
    cadence: str | None = None
    api_ceiling: float | None = None
    """Output tokens/s the API servers held it to (:func:`~.plan.at_api_ceiling`), if any."""
    ttft_s: float | None = None
    """TTFT p50 under ``serve``; None for an offline batch."""
    host_paced: bool = False
    """Whether the model's host time per step, not its GPU time, sets the step."""


def layout_name(pp: int, tp: int) -> str:
    """How ``plan`` names a layout of ``pp`` stages of ``tp`` GPUs: ``PP=2``, ``TP=2``,
    ``TP=2 x PP=2``."""
    if pp == 1:
        return f"TP={tp}"
    return f"TP={tp} x PP={pp}" if tp > 1 else f"PP={pp}"


def intake_s(api_servers: int) -> float:
    """A served request's intake (:data:`SERVE_INTAKE_S`) with ``api_servers`` API servers:
    a part every request pays and a part the API servers share, through both fits."""
    shared = (SERVE_INTAKE_S[1] - SERVE_INTAKE_S[4]) * 4 / 3
    return SERVE_INTAKE_S[1] - shared + shared / max(1, api_servers)


def kv_read_s(shape: ModelShape, batch: float, context: float, rates: Rates = FITTED) -> float:
    """One layer's reads of the KV cache in a decode step of ``batch`` requests."""
    per_token = 2 * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes
    return batch * context * per_token / rates.bytes_per_s


def host_s(batch: float, work: Workload) -> float:
    """The engine's host time for one step of ``batch`` requests under ``work``."""
    fixed = SERVE_HOST_STEP_S if work.kind == "serve" else HOST_STEP_S
    return fixed + HOST_PER_REQUEST_S * batch


def prefill_s(shape: ModelShape, tokens: int, gpus: int, rates: Rates = FITTED) -> float:
    """GPU time of one request's prefill, spread over ``gpus`` (compute-bound)."""
    return shape.num_layers * shape.layer_flops(tokens) / rates.flops_per_s / gpus


def tp_shard(shape: ModelShape, tp: int) -> ModelShape:
    """The part of ``shape`` one of ``tp`` ranks holds (vLLM's column/row split)."""
    return replace(shape, num_heads=shape.num_heads // tp,
                   num_kv_heads=max(1, shape.num_kv_heads // tp),
                   intermediate_size=shape.intermediate_size // tp,
                   expert_intermediate_size=shape.expert_intermediate_size // tp,
                   shared_expert_intermediate_size=shape.shared_expert_intermediate_size // tp,
                   vocab_size=shape.vocab_size // tp)


#: The config keys one TP rank holds a 1/tp share of (vLLM's column/row split).
_SHARDED_KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size",
                 "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size")


def tp_shard_config(config: dict, tp: int) -> dict:
    """A Hugging Face config of one TP rank's shard, as a model of its own: what a cost
    table of the shard is measured on (``benchmarks/tools/cost_table.py --tp``)."""
    sharded = {key: max(1, int(config[key]) // tp) for key in _SHARDED_KEYS if config.get(key)}
    return dict(config, head_dim=ModelShape.from_config(config).head_dim, **sharded)


CostsAt = Callable[[int], StageCosts]


def _step_costs(costs_at: CostsAt | None, shape: ModelShape, batch: float, prefill: float,
                tp: int, rates: Rates = FITTED) -> StageCosts:
    """One rank's costs of a step decoding ``batch`` requests with ``prefill`` prompt
    tokens beside them: the layers carry every token, the LM head the decodes."""
    costs_at = costs_at or (lambda b: stage_costs(shape, b, rates=rates))

    def at(tokens: float) -> StageCosts:
        size = max(1, round(tokens))
        return shard_costs(shape, tp, size, costs_at, rates) if tp > 1 else costs_at(size)

    costs = at(batch)
    return replace(costs, layer_s=at(batch + prefill).layer_s) if prefill else costs


def _stage_times(costs_at: CostsAt | None, shape: ModelShape, split: tuple[int, ...],
                 batch: float, context: float, tp: int, link: Link, rates: Rates = FITTED,
                 prefill: float = 0.0) -> list[float]:
    """Each stage's GPU time per decode step of ``batch`` requests (and ``prefill`` prompt
    tokens beside them); with ``tp`` > 1 one rank's, its shard's costs and two all-reduces
    per layer."""
    costs = _step_costs(costs_at, shape, batch, prefill, tp, rates)
    kv_shape, per_layer = shape, 0.0
    if tp > 1:
        kv_shape = tp_shard(shape, tp)
        per_layer = 2 * link.tp_all_reduce_s(
            (batch + prefill) * shape.hidden_size * shape.dtype_bytes, tp)
    pp = len(split)
    return [costs.stage_s(i, pp, n) + n * (kv_read_s(kv_shape, batch, context, rates) + per_layer)
            for i, n in enumerate(split)]


def _delivery(layout: str, work: Workload, shape: ModelShape, gpus: int, tpot_s: float,
              busy: list[float], rates: Rates = FITTED, host_paced: bool = False,
              **extra) -> Prediction:
    """req/s of ``work`` where a token of every running request takes ``tpot_s``, each
    request also waiting its share of prefilling the running requests' prompts (under
    ``serve`` their first tokens wait on it, though the prompts ride in the decode steps,
    or on being taken in, whichever is longer)."""
    running, serve = work.running, work.kind == "serve"
    wait = running * prefill_s(shape, work.input_len, gpus, rates)
    if serve:
        wait = max(wait, running * intake_s(work.api_servers))
    per_request = (work.output_len * tpot_s + wait) / running
    return Prediction(layout, tpot_s=tpot_s, req_per_s=1 / per_request,
                      output_tok_per_s=work.output_len / per_request,
                      busy=tuple(min(1.0, b) for b in busy),
                      ttft_s=TTFT_P50_SHARE * wait if serve else None, host_paced=host_paced,
                      **extra)


def pipeline(shape: ModelShape, split: tuple[int, ...], work: Workload, cadence: str,
             link: Link, costs_at: CostsAt | None = None, tp: int = 1,
             rates: Rates = FITTED, stock_factor: float = STOCK_PP_GPU_FACTOR) -> Prediction:
    """PP over ``len(split)`` stages of ``tp`` GPUs each, with ``cadence`` ``balance``,
    ``merge``, ``vllm`` (vLLM's cadence on the plugin's runner: groups and cost as
    ``balance``'s) or ``stock`` (groups as ``balance``, at ``stock_factor`` times the
    plugin's cost per step), on GPUs of ``rates``."""
    pp, running, context = len(split), work.running, work.mean_context
    group = running if cadence == "merge" else running / pp
    prefill = work.prefill_per_round * group / running
    # vLLM hands the hidden states and the residual to the next stage.
    handoff = link.transfer_s(2 * shape.hidden_size * shape.dtype_bytes * (group + prefill))
    times = _stage_times(costs_at, shape, split, group, context, tp, link, rates, prefill)
    if cadence == "merge":
        gpu, host = sum(times) + (pp - 1) * handoff, host_s(running, work)
        tpot = max(gpu, host)
        busy = [t / tpot for t in times]
    else:
        if cadence == "stock":
            times = [t * stock_factor for t in times]
        gpu, host = max(times) + handoff, host_s(group, work)
        step = max(gpu, host)
        tpot = pp * step
        busy = [t / step for t in times]
    layout = f"{'stock' if cadence == 'stock' else 'plugin'} {layout_name(pp, tp)}"
    return _delivery(layout, work, shape, pp * tp, tpot, busy, rates, host > gpu, pp=pp,
                     tp=tp, cadence=None if cadence == "stock" else cadence)


def shard_costs(shape: ModelShape, tp: int, batch: int, costs_at: CostsAt,
                rates: Rates = FITTED) -> StageCosts:
    """One TP rank's costs: the shard's measured table where one ships, else its modelled
    costs scaled by ``costs_at`` over the full shape's modelled ones."""
    shard_shape = tp_shard(shape, tp)
    if (found := find_table(shard_shape)) is not None:
        return table_costs(shard_shape, *found, batch, rates)
    shard, full, model = (modelled_costs(shard_shape, batch, rates), costs_at(batch),
                          modelled_costs(shape, batch, rates))
    return replace(shard, layer_s=shard.layer_s * full.layer_s / model.layer_s,
                   head_s=shard.head_s * full.head_s / model.head_s,
                   source=f"the bytes/FLOPs model scaled to {full.source}")


def tensor_parallel(shape: ModelShape, tp: int, work: Workload, link: Link,
                    costs_at: CostsAt | None = None, rates: Rates = FITTED) -> Prediction:
    """TP over ``tp`` GPUs of ``rates``: every request every step, two all-reduces per layer."""
    shard, running, prefill = tp_shard(shape, tp), work.running, work.prefill_per_round
    costs = _step_costs(costs_at, shape, running, prefill, tp, rates)
    gpu = (costs.stage_s(0, 1, shape.num_layers)
           + shape.num_layers * kv_read_s(shard, running, work.mean_context, rates)
           + 2 * shape.num_layers * link.tp_all_reduce_s(
               (running + prefill) * shape.hidden_size * shape.dtype_bytes, tp))
    host = host_s(running, work)
    tpot = max(gpu, host)
    return _delivery(f"stock {layout_name(1, tp)}", work, shape, tp, tpot, [gpu / tpot] * tp, rates,
                     host > gpu, pp=1, tp=tp)


def plugin_auto(shape: ModelShape, split: tuple[int, ...], work: Workload, link: Link,
                costs_at: CostsAt | None = None, tp: int = 1,
                rates: Rates = FITTED) -> Prediction:
    """What the plugin's ``auto`` runs: vLLM's cadence, unless ``balance`` or ``merge`` is
    predicted faster by ``auto``'s margin (with the plugin's worker, vLLM's groups cost
    what ``balance``'s do here, so ``balance`` never is)."""
    from vllm_pp_cudagraph.engine_core.cadence_policy import MARGIN

    kept = pipeline(shape, split, work, "vllm", link, costs_at, tp, rates)
    others = [pipeline(shape, split, work, c, link, costs_at, tp, rates)
              for c in ("balance", "merge")]
    best = max(others, key=lambda p: p.req_per_s)
    return best if best.req_per_s * (1 - MARGIN) > kept.req_per_s else kept
