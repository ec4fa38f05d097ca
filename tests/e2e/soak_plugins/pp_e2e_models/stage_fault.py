"""Qwen3 whose first or last pipeline stage fails while serving, on request of a file.

While the file named by ``PP_E2E_FAULT_FILE`` exists, the forward of the stage
``PP_E2E_FAULT_STAGE`` names (``first``, the default, or ``last``) raises. The
fault-injection check starts a server, serves, creates the file, and measures
how the server ends.
"""

from __future__ import annotations

import os

from vllm.distributed.parallel_state import get_pp_group
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

#: The stages a fault can be asked for, by ``PP_E2E_FAULT_STAGE``.
FAULT_STAGES = ("first", "last")


class InjectedStageFault(RuntimeError):
    """The fault the check asked for."""


def fault_stage() -> str:
    """The stage ``PP_E2E_FAULT_STAGE`` names; a bad value is an error, not a silent default."""
    stage = os.environ.get("PP_E2E_FAULT_STAGE", "first")
    if stage not in FAULT_STAGES:
        raise ValueError(f"PP_E2E_FAULT_STAGE={stage!r}: expected one of {FAULT_STAGES}")
    return stage


def faults_here(stage: str, is_first: bool, is_last: bool) -> bool:
    """Whether a stage that is first/last in the pipeline is the one asked to fail."""
    return is_first if stage == "first" else is_last


class StageFaultQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3; one stage's forward raises while ``PP_E2E_FAULT_FILE`` exists."""

    def forward(self, *args, **kwargs):
        flag = os.environ.get("PP_E2E_FAULT_FILE")
        if flag and os.path.exists(flag):
            stage, group = fault_stage(), get_pp_group()
            if faults_here(stage, group.is_first_rank, group.is_last_rank):
                raise InjectedStageFault(f"injected fault on the {stage} stage ({flag} exists)")
        return super().forward(*args, **kwargs)
