"""Stock vLLM plus the plugin's preemption fix alone: the soak's preemption baseline.

Under PP, stock vLLM 0.26 dies when a request is preempted while its output is
still in flight (see ``vllm_pp_cudagraph.engine.async_preemption``). To measure how
often two stock runs differ under preemption, stock needs that one scheduler
fix and nothing else: this plugin applies it alone, leaving vLLM's runner,
graphs and schedule as they are. Where ``pp_cudagraph`` is loaded as well, it
applies the fix itself and this plugin does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

PATCH_NAME = "async-preemption"

_undo: list[Callable[[], None]] = []


def register() -> None:
    """Apply the plugin's scheduler fix for preemption under PP, once per process."""
    from vllm_pp_cudagraph.compat import patches
    from vllm_pp_cudagraph.settings import PPCudaGraphSettings

    if _undo or patches.is_applied():
        return
    undo = patches.apply_patch(PATCH_NAME, PPCudaGraphSettings.from_env({}))
    if undo is not None:  # None: this vLLM needs no fix
        _undo.append(undo)


def undo() -> None:
    """Restore vLLM's scheduler (used by tests)."""
    while _undo:
        _undo.pop()()
