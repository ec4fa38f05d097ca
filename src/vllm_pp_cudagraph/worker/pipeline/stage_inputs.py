"""Checking a stage's received tensors against its input buffers, from metadata alone."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


class StageInputMismatchError(RuntimeError):
    """The tensors a pipeline stage received do not match what it expects."""


def _key_problems(expected: Mapping, got: Mapping) -> list[str]:
    problems = []
    if missing := sorted(expected.keys() - got.keys()):
        problems.append(f"missing keys {missing}")
    if extra := sorted(got.keys() - expected.keys()):
        problems.append(f"unexpected keys {extra}")
    return problems


def _dims(buffer: torch.Tensor) -> str:
    return ", ".join(map(str, buffer.shape[1:]))


def check_stage_inputs(expected: Mapping[str, torch.Tensor], received: object, min_tokens: int,
                       stage: int | None = None, tp_size: int = 1) -> int:
    """Return the token count of ``received``, or raise :class:`StageInputMismatchError`
    where it does not fit the buffers ``expected`` (``tp_size``: of pending receives)."""
    # Reading `.tensors` on AsyncIntermediateTensors waits for the transfer; metadata is final.
    tensors = object.__getattribute__(received, "tensors")
    problems = _key_problems(expected, tensors)
    token_counts = set()
    for key in expected.keys() & tensors.keys():
        tokens, tensor_problems = _tensor_problems(key, expected[key], tensors[key], tp_size)
        problems += tensor_problems
        if tokens is not None:
            token_counts.add(tokens)
    if len(token_counts) > 1:
        problems.append(f"keys disagree on the token count: {sorted(token_counts)}")
    num_tokens = min(token_counts, default=0)
    if token_counts and num_tokens < min_tokens:
        problems.append(f"received {num_tokens} tokens but this step schedules {min_tokens}")
    if problems:
        where = f"pipeline stage {stage}" if stage is not None else "this pipeline stage"
        raise StageInputMismatchError(
            f"{where} received intermediate tensors that do not match its input "
            f"buffers: {'; '.join(problems)}. The previous stage's model produces "
            "different tensors than this stage's make_empty_intermediate_tensors() "
            "declares; check that every stage runs the same model code and "
            "configuration (model, dtype, --pipeline-parallel-size).")
    return num_tokens


def _tensor_problems(key: str, want: torch.Tensor, got: torch.Tensor,
                     tp_size: int) -> tuple[int | None, list[str]]:
    """Tokens ``got`` carries for buffer ``want`` (None if its shape does not fit), and problems."""
    problems = []
    if got.dtype != want.dtype:
        problems.append(f"{key!r} has dtype {got.dtype}, expected {want.dtype}")
    tokens, shape_problem = _token_count(key, want, got, tp_size)
    if shape_problem is not None:
        return None, [*problems, shape_problem]
    if tokens > want.shape[0]:
        problems.append(f"{key!r} carries {tokens} tokens, more than the buffer's "
                        f"{want.shape[0]} (max_num_batched_tokens)")
    return tokens, problems


def _token_count(key: str, want: torch.Tensor, got: torch.Tensor,
                 tp_size: int) -> tuple[int | None, str | None]:
    """The leading dim of ``got`` read against buffer ``want``, or why it cannot be read (a
    1-D ``got`` is a pending receive: one of ``tp_size`` flat shares)."""
    if got.dim() == 1 and want.dim() > 1:
        numel = got.numel() * tp_size
        row = math.prod(want.shape[1:])
        if numel % row:
            return None, (f"{key!r} has {numel} elements, not a whole number of "
                          f"(tokens, {_dims(want)}) rows")
        return numel // row, None
    if got.dim() != want.dim() or got.shape[1:] != want.shape[1:]:
        return None, f"{key!r} has shape {tuple(got.shape)}, expected (tokens, {_dims(want)})"
    return got.shape[0], None


def check_padding_agreement(received_tokens: int, padded_tokens: int, stage: int) -> None:
    """Raise :class:`StageInputMismatchError` unless the previous stage padded as this one."""
    if received_tokens != padded_tokens:
        raise StageInputMismatchError(
            f"pipeline stage {stage} expected {padded_tokens} tokens (after CUDA-graph "
            f"padding) but the previous stage sent {received_tokens}: the stages "
            "chose different CUDA graphs for this step. Set the same "
            "compilation_config.cudagraph_mode and cudagraph_capture_sizes for all "
            "stages, or run with enforce_eager=True.")


Schema = dict[str, tuple[tuple[int, ...], str]]
"""Key -> (trailing dims, dtype name) of the tensors passed between stages."""


def schema_of(tensors: Mapping[str, torch.Tensor]) -> Schema:
    return {k: (tuple(v.shape[1:]), str(v.dtype)) for k, v in tensors.items()}


#: Where the sending side of a start-up check comes from, as the error names it.
DECLARED = "declared by make_empty_intermediate_tensors()"
PRODUCED = "returned by the model's forward in the profiling run"


def check_handoff_schemas(sends: list[Schema | None], expects: list[Schema | None],
                          sent_as: str = DECLARED, reserved_prefixes: tuple[str, ...] = ()) -> None:
    """At start-up, raise unless what each stage sends (``sends[i]``, None for none) equals what
    the next expects (``expects[i + 1]``); ``reserved_prefixes``: keys DECLARED ones may lack."""
    problems = []
    for stage in range(len(sends) - 1):
        out, want = sends[stage], expects[stage + 1]
        if out is None or want is None:
            continue
        if sent_as == DECLARED and reserved_prefixes:
            want = {k: v for k, v in want.items()
                    if k in out or not k.startswith(reserved_prefixes)}
        if out == want:
            continue
        differ = sorted(k for k in want.keys() & out.keys() if want[k] != out[k])
        detail = _key_problems(want, out)
        for k in differ:
            detail.append(f"{k!r} is {out[k]} but expected {want[k]} (dims, dtype)")
        problems.append(f"stage {stage} -> stage {stage + 1} (tensors {sent_as}): "
                        f"{'; '.join(detail)}")
    if problems:
        raise StageInputMismatchError(
            "Pipeline stages disagree on the tensors they exchange: " + " | ".join(problems)
            + ". Every stage must run the same model code and configuration "
            "(same vLLM and model version, dtype and hf_config on every host).")
