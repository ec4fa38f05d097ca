"""Applying the last stage's sampled tokens on a first stage as soon as a step needs them.

vLLM's first stages apply the tokens the last stage sampled at step T to their
request state at step T + ``pp_size`` (``PPHandler``'s ring), which is right
as long as a request decodes once every ``pp_size`` steps. When the scheduler
lets a request decode sooner (decode_cadence.py), the first stage must apply
its newer tokens first: :func:`consume_entries_needed_by` takes, before a step
runs, every entry still waiting in the ring that holds a request the step
decodes, oldest first. The step's forward then waits on the GPU for those
tokens, not on the host. Entries nobody needs yet keep vLLM's timing, so with
vLLM's schedule this never acts. It depends only on what a step schedules, so
it is right for any schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vllm_pp_cudagraph import compat


def batch_req_indices(req_ids: Sequence[str], req_id_to_index: dict[str, int]) -> np.ndarray:
    """Request-state indices of the cached requests a step schedules."""
    found = [req_id_to_index[r] for r in req_ids if r in req_id_to_index]
    return np.fromiter(found, dtype=np.int32, count=len(found))


def _live_rows(handler: Any, entry: Any) -> np.ndarray:
    """Rows of a ring entry whose request still needs its sampled tokens."""
    alive = handler.req_idx_gen_np[entry.idx_mapping_np] == entry.gen_at_receive_np
    return alive & entry.need_sampled_mask


def consume_entries_needed_by(
    handler: Any, req_indices: np.ndarray, draft_tokens: Any = None
) -> list[dict]:
    """Consume from ``handler``'s ring, early, the entries a step with ``req_indices`` needs.

    ``handler`` is vLLM's ``PPHandler`` on a first stage, after this step's
    ``get_prev_sampled_outputs``: its queue then holds one slot per step still
    in flight, oldest first, the last one reserved for this step. Every entry
    up to the newest that holds a live request of this step is consumed, oldest
    first, and its slot left as ``None`` so the ring keeps its length and
    vLLM's later consume of that slot finds nothing to do. Returns the
    ``postprocess_sampled`` arguments of each entry that still has live rows.
    """
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
            outputs = _consume_now(handler, entry, draft_tokens)
            if outputs is not None:
                consumed.append(outputs)
    return consumed


def _consume_now(handler: Any, entry: Any, draft_tokens: Any = None) -> dict | None:
    """vLLM's own consume of one entry: freed and unneeded rows masked, the broadcast awaited.

    ``get_prev_sampled_outputs`` consumes the head of the ring and reserves a
    slot at its tail, so the entry is put at the head and that slot taken off
    again, leaving the ring as it was.
    """
    handler.queue.appendleft(entry)
    outputs = compat.prev_sampled_outputs(handler, draft_tokens)
    handler.queue.pop()
    return outputs
