"""The plugin's CUDA-graph manager for Model Runner V2 under pipeline parallelism."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn as nn
from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.distributed.parallel_state import get_pp_group, get_tp_group
from vllm.logger import init_logger
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

from vllm_pp_cudagraph.shared.snapshots import CaptureRecord, write_snapshot
from vllm_pp_cudagraph.worker.graphs import descriptors
from vllm_pp_cudagraph.worker.graphs.capture_guard import (
    CapturedCommunicationError, forbid_pipeline_communication)
from vllm_pp_cudagraph.worker.graphs.graph_agreement import (
    Agreement, CaptureOutcome, agree, merge_tp_peers)
from vllm_pp_cudagraph.worker.pipeline.stage_exchange import (
    gather_from_stages, gather_from_tp_peers)

logger = init_logger("vllm.pp_cudagraph.manager")


def settle(outcome: CaptureOutcome) -> Agreement:
    """What this rank keeps: TP peers merge outcomes per stage, then all stages agree."""
    return agree(gather_from_stages(merge_tp_peers(gather_from_tp_peers(outcome))),
                 outcome.stage)


class PPCudaGraphManager(ModelCudaGraphManager):
    """MRV2's model CUDA-graph manager with PP handling: captures uniform FULL shapes only
    (descriptors.py) with pipeline communication forbidden (capture_guard.py), then agrees
    with the other stages on one set of graphs or all eager (graph_agreement.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage = get_pp_group().rank_in_group
        #: Graph memory measured before KV-cache sizing, for the capture log line.
        self.estimated_bytes: int | None = None
        #: Whether the last batch dispatched replays a graph (FULL or PIECEWISE).
        self.last_replayed = False
        #: The most one capture of this process took (vLLM may capture more than once).
        self.captured_bytes = 0

    def dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's choice of graph for a batch; the last one is kept for the stage's metrics."""
        desc = super().dispatch(*args, **kwargs)
        self.last_replayed = desc.cg_mode not in (None, CUDAGraphMode.NONE)
        return desc

    def _init_candidates(self) -> None:
        super()._init_candidates()
        dropped = descriptors.prune_invalid(self._capture_descs, self._candidates,
                                            self.max_num_reqs)
        if dropped:
            logger.info("Not capturing %d FULL graph shape(s) whose dummy batch would have "
                        "unequal query lengths (num_tokens %% num_reqs != 0): %s; their "
                        "batches replay the next larger uniform FULL graph.",
                        len(dropped), sorted(d.num_tokens for d in dropped))

    def graph_counts(self) -> dict[str, int]:
        counts = {mode.name: len(descs) for mode, descs in self._capture_descs.items()}
        if self.use_breakable_cg and "PIECEWISE" in counts:
            counts["PIECEWISE(breakable)"] = counts.pop("PIECEWISE")
        return counts

    def capture(self, *args: Any, **kwargs: Any) -> None:
        """Capture with PP communication forbidden, then agree across stages."""
        start = time.perf_counter()
        free_before = torch.accelerator.get_memory_info()[0]
        error = None
        fatal: CapturedCommunicationError | None = None
        try:
            with forbid_pipeline_communication((get_pp_group(),)):
                super().capture(*args, **kwargs)
        except CapturedCommunicationError as exc:
            fatal = exc  # a bug to surface, but only after the peers are told
            error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported to every stage below
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("CUDA-graph capture failed on pipeline stage %d", self.stage)
        self.settle_with_other_stages(error)
        if fatal is not None:
            raise fatal
        used = free_before - torch.accelerator.get_memory_info()[0]
        estimate = "" if self.estimated_bytes is None else (
            f", estimated {self.estimated_bytes / (1 << 30):.2f} GiB before KV-cache sizing")
        logger.info("PPCudaGraphManager captured on pipeline stage %d: %s in %.1f s, %.2f GiB%s",
                    self.stage, self.graph_counts() or "no graphs (eager)",
                    time.perf_counter() - start, used / (1 << 30), estimate)
        # What this rank's graphs took, beside the estimate (shared/snapshots.py).
        self.captured_bytes = max(self.captured_bytes, used)
        estimated = None if self.estimated_bytes is None else self.estimated_bytes / (1 << 30)
        record = {"estimated_gib": estimated, "captured_gib": self.captured_bytes / (1 << 30),
                  "graphs": self.graph_counts()}
        write_snapshot(CaptureRecord(f"{self.stage}-{get_tp_group().rank_in_group}", record))

    def settle_with_other_stages(self, error: str | None = None) -> None:
        """Exchange capture outcomes with every rank and keep what all have; every rank must
        call this once after (or instead of) capture, or the others wait for it."""
        captured = frozenset(d for descs in self._capture_descs.values() for d in descs)
        outcome = CaptureOutcome(self.stage, captured if error is None else frozenset(), error)
        self.apply_agreement(settle(outcome))

    def apply_agreement(self, agreement: Agreement) -> None:
        """Keep only the graphs every stage has; all-eager if none."""
        if agreement.reason:
            logger.warning("Pipeline stage %d: %s", self.stage, agreement.reason)
        if agreement.all_eager:
            self._graphs_captured = False
            self._capture_descs.clear()
            self._candidates.clear()
            self.graphs.clear()
            if self.breakable_cg_runner is not None:
                self.breakable_cg_runner.clear_graphs()
            return
        descriptors.keep_only(self._capture_descs, self._candidates, agreement.keep)
        for desc in list(self.graphs):
            if desc not in agreement.keep:
                del self.graphs[desc]

    def init_breakable_cg_runner(self, model: nn.Module,
                                 key_fn: Callable[..., Hashable] | None = None) -> None:
        """Wrap ``model`` for breakable capture, once, sharing this manager's pool; ``key_fn``
        is passed on only when given, since older wrappers lack it."""
        if self.breakable_cg_runner is not None:
            return
        extra = {} if key_fn is None else {"key_fn": key_fn}
        runner = BreakableCUDAGraphWrapper(model, self.vllm_config, **extra)
        # Share the FULL graphs' pool so segment memory is not reserved twice.
        if self.pool is not None:
            runner.graph_pool = self.pool
        self.breakable_cg_runner = runner

    def run_pw_graph(self, model: nn.Module, model_inputs: dict[str, Any]) -> Any:
        """Run one piecewise step: breakable graphs or torch.compile's graphs."""
        if not self.use_breakable_cg:
            return model(**model_inputs)
        if self.breakable_cg_runner is None:
            raise RuntimeError(
                "Breakable CUDA graphs are enabled but were never captured on this "
                "rank, so PIECEWISE steps cannot run. Disable breakable mode "
                "(unset VLLM_PP_CUDAGRAPH_BREAKABLE and VLLM_USE_BREAKABLE_CUDAGRAPH).")
        return self.breakable_cg_runner(**model_inputs)
