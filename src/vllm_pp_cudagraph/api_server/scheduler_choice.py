"""Naming the plugin's scheduler as a pipeline-parallel engine's ``scheduler_cls``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vllm_pp_cudagraph.shared.engine_plan import PLUGIN_SCHEDULER


def wrap_config_post_init(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``VllmConfig.__post_init__``: under PP with vLLM's default async scheduler, name
    the plugin's subclass of it; a class the user (or vLLM) chose is kept, with vLLM's cadence."""

    @functools.wraps(original)
    def __post_init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        scheduler = self.scheduler_config
        if (scheduler.scheduler_cls is None and scheduler.async_scheduling
                and self.parallel_config.pipeline_parallel_size > 1):
            scheduler.scheduler_cls = PLUGIN_SCHEDULER

    return __post_init__
