"""Qwen3 whose first pipeline stage fails while serving, on request of a file.

While the file named by ``PP_E2E_FAULT_FILE`` exists, the first stage's forward
raises. The fault-injection check starts a server, serves, creates the file,
and measures how the server ends.
"""

from __future__ import annotations

import os

from vllm.distributed.parallel_state import get_pp_group
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM


class InjectedStageFault(RuntimeError):
    """The fault the check asked for."""


class StageFaultQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3; the first stage's forward raises while ``PP_E2E_FAULT_FILE`` exists."""

    def forward(self, *args, **kwargs):
        flag = os.environ.get("PP_E2E_FAULT_FILE")
        if flag and get_pp_group().is_first_rank and os.path.exists(flag):
            raise InjectedStageFault(f"injected fault on the first stage ({flag} exists)")
        return super().forward(*args, **kwargs)
