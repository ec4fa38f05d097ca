"""Qwen3 variants whose pipeline stages disagree on one exchanged tensor."""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.distributed.parallel_state import get_pp_group
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.sequence import IntermediateTensors

MakeEmpty = Callable[[int, torch.dtype, torch.device], IntermediateTensors]


def with_undeclared_key(make_empty: MakeEmpty, key: str = "aux") -> MakeEmpty:
    """``make_empty`` plus one more tensor, shaped like the first one it makes."""

    def make(batch_size: int, dtype: torch.dtype, device: torch.device) -> IntermediateTensors:
        tensors = make_empty(batch_size, dtype, device)
        tensors[key] = torch.zeros_like(next(iter(tensors.tensors.values())))
        return tensors

    return make


class StageMismatchQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3, except that the last stage's input buffers expect an ``aux`` tensor."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if get_pp_group().is_last_rank:
            self.make_empty_intermediate_tensors = with_undeclared_key(
                self.make_empty_intermediate_tensors
            )


def with_undeclared_output(output, key: str = "aux"):
    """A non-last stage's ``output`` plus one tensor its model never declared."""
    if isinstance(output, IntermediateTensors):
        output[key] = torch.zeros_like(output["hidden_states"])
    return output


class UndeclaredOutputQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3, except that non-last stages also send an ``aux`` tensor."""

    def forward(self, *args, **kwargs):
        return with_undeclared_output(super().forward(*args, **kwargs))
