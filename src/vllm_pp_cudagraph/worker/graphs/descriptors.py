"""Which (num_tokens, num_reqs) shapes FULL graphs may be captured at: uniform batches only."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vllm.config.compilation import CUDAGraphMode

if TYPE_CHECKING:
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor


def capture_num_reqs(desc: BatchExecutionDescriptor, max_num_reqs: int) -> int:
    """How many dummy requests vLLM's capture builds for ``desc``."""
    return desc.num_reqs or min(desc.num_tokens, max_num_reqs)


def captures_uniform_batch(desc: BatchExecutionDescriptor, max_num_reqs: int) -> bool:
    """Whether capturing ``desc`` gives every dummy request the same query length."""
    num_reqs = capture_num_reqs(desc, max_num_reqs)
    if desc.num_tokens % num_reqs:
        return False
    uniform = desc.uniform_token_count
    return uniform is None or desc.num_tokens == num_reqs * uniform


def is_valid(desc: BatchExecutionDescriptor, max_num_reqs: int) -> bool:
    """FULL graphs must capture uniform batches; piecewise graphs hold no attention."""
    return desc.cg_mode != CUDAGraphMode.FULL or captures_uniform_batch(desc, max_num_reqs)


def _same_kind(a: BatchExecutionDescriptor, b: BatchExecutionDescriptor) -> bool:
    return (a.cg_mode == b.cg_mode and a.uniform_token_count == b.uniform_token_count
            and a.num_active_loras == b.num_active_loras
            and (a.num_reqs is None) == (b.num_reqs is None))


def replacement(desc: BatchExecutionDescriptor,
                valid: Iterable[BatchExecutionDescriptor]) -> BatchExecutionDescriptor | None:
    """The smallest valid descriptor of the same kind that covers ``desc``."""
    covering = [d for d in valid if _same_kind(d, desc) and d.num_tokens >= desc.num_tokens
                and (d.num_reqs is None or d.num_reqs >= (desc.num_reqs or 0))]
    return min(covering, key=lambda d: (d.num_tokens, d.num_reqs or 0), default=None)


def _retain(table: dict, keep) -> None:
    for key in list(table):
        table[key] = [d for d in table[key] if keep(d)]
        if not table[key]:
            del table[key]


def prune_invalid(capture_descs: dict[CUDAGraphMode, list[BatchExecutionDescriptor]],
                  candidates: dict[tuple[int, int], list[BatchExecutionDescriptor]],
                  max_num_reqs: int) -> list[BatchExecutionDescriptor]:
    """Drop invalid descriptors in place from both tables; return those dropped (in
    ``candidates`` each gives way to its smallest valid covering one)."""
    dropped = [d for descs in capture_descs.values() for d in descs if not is_valid(d, max_num_reqs)]
    if not dropped:
        return []
    _retain(capture_descs, lambda d: is_valid(d, max_num_reqs))
    valid = [d for descs in capture_descs.values() for d in descs]
    for key in list(candidates):
        kept = (d if is_valid(d, max_num_reqs) else replacement(d, valid) for d in candidates[key])
        if unique := list(dict.fromkeys(d for d in kept if d is not None)):
            candidates[key] = unique
        else:
            del candidates[key]
    return dropped


def keep_only(capture_descs: dict[CUDAGraphMode, list[BatchExecutionDescriptor]],
              candidates: dict[tuple[int, int], list[BatchExecutionDescriptor]],
              keep: frozenset[BatchExecutionDescriptor]) -> None:
    """Restrict both tables to ``keep`` (after cross-stage agreement)."""
    _retain(capture_descs, keep.__contains__)
    _retain(candidates, keep.__contains__)
