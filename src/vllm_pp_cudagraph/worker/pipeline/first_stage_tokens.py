"""Applying the last stage's sampled tokens on a first stage as soon as a step needs them: the
worker half of the decode cadence (docs/architecture.md, "One engine step at PP=2")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_pp_cudagraph.shared import vllm_surface


def batch_req_indices(req_ids: Sequence[str], req_id_to_index: dict[str, int]) -> np.ndarray:
    """Request-state indices of the cached requests a step schedules."""
    found = [req_id_to_index[r] for r in req_ids if r in req_id_to_index]
    return np.fromiter(found, dtype=np.int32, count=len(found))


def _live_rows(handler: Any, entry: Any) -> np.ndarray:
    """Rows of a ring entry whose request still needs its sampled tokens."""
    alive = handler.req_idx_gen_np[entry.idx_mapping_np] == entry.gen_at_receive_np
    return alive & entry.need_sampled_mask


def consume_entries_needed_by(handler: Any, req_indices: np.ndarray,
                              draft_tokens: Any = None) -> list[dict]:
    """Consume early the entries of ``handler``'s ring (vLLM's ``PPHandler``) this step needs;
    return the ``postprocess_sampled`` arguments of each with live rows."""
    if req_indices.size == 0:
        return []
    pending = list(handler.queue)[:-1]
    newest = -1
    for position, entry in enumerate(pending):
        if entry is None:
            continue
        rows = entry.idx_mapping_np[_live_rows(handler, entry)]
        if np.isin(rows, req_indices).any():
            newest = position
    consumed = []
    for position in range(newest + 1):
        entry = handler.queue[position]
        if entry is not None:
            handler.queue[position] = None
            # vLLM's own consume of this entry: freed and unneeded rows masked, broadcast awaited.
            handler.queue.appendleft(entry)
            outputs = vllm_surface.prev_sampled_outputs(handler, draft_tokens)
            handler.queue.pop()
            if outputs is not None:
                consumed.append(outputs)
    return consumed
