"""Everything that depends on which vLLM release is installed.

The rest of the package asks this module, never ``vllm.__version__``
directly, so widening the supported range means editing one file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

#: Releases this plugin is tested against: lower bound inclusive, upper exclusive.
SUPPORTED_MIN = (0, 26, 0)
SUPPORTED_BELOW = (0, 27, 0)
SUPPORTED_RANGE = ">=0.26.0,<0.27"

#: Module whose ``GPUModelRunner`` attribute the worker imports at construction time.
V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
#: Module holding MRV2's CUDA-graph manager.
V2_CUDAGRAPH_MODULE = "vllm.v1.worker.gpu.cudagraph_utils"
#: Modules whose attention ops are decorated for breakable graphs at import time.
BREAKABLE_DECORATED_MODULES = ("vllm.model_executor.layers.attention.attention",)
#: Module of the scheduler used with async scheduling.
ASYNC_SCHEDULER_MODULE = "vllm.v1.core.sched.async_scheduler"
#: Module of ``CompilationConfig``, which picks the piecewise split points.
COMPILATION_CONFIG_MODULE = "vllm.config.compilation"
#: The KV-cache-write ops vLLM splits piecewise graphs at (0.26).
KV_CACHE_UPDATE_OPS = ("vllm::unified_kv_cache_update", "vllm::unified_mla_kv_cache_update")


@dataclass(frozen=True)
class VersionInfo:
    """The installed vLLM (and torch) version and whether the plugin supports it."""

    vllm: str | None
    torch: str | None

    @property
    def installed(self) -> bool:
        return self.vllm is not None

    @property
    def supported(self) -> bool:
        release = parse_release(self.vllm) if self.vllm else None
        return release is not None and SUPPORTED_MIN <= release < SUPPORTED_BELOW


def parse_release(version: str) -> tuple[int, int, int] | None:
    """``'0.26.0'``, ``'0.26.1.dev3+gabc'`` -> ``(0, 26, 0)`` / ``(0, 26, 1)``.

    Pre-releases of the lower bound (``0.26.0rc1``) count as that release:
    the plugin is tested against the final one, and users who run a
    release candidate opt in with the override setting if this is wrong.
    """
    match = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_versions() -> VersionInfo:
    """Read versions from package metadata, without importing vLLM or torch."""
    return VersionInfo(vllm=_dist_version("vllm"), torch=_dist_version("torch"))


def manager_init_args(stock: object) -> tuple[tuple, dict]:
    """Arguments that rebuild MRV2's model CUDA-graph manager like ``stock``.

    0.24-0.26: ``(vllm_config, device, cudagraph_mode, decode_query_len,
    lora_capture_cases=...)``; 0.22 has no ``lora_capture_cases``.
    """
    args = (stock.vllm_config, stock.device, stock.cudagraph_mode)
    kwargs = {"decode_query_len": stock.decode_query_len}
    if hasattr(stock, "lora_capture_cases"):
        kwargs["lora_capture_cases"] = stock.lora_capture_cases
    return args, kwargs


def async_preemption_keeps_stale_placeholders(async_scheduler_cls: type) -> bool:
    """Whether preempting a request leaves its in-flight output placeholders behind.

    True up to 0.26. The upstream rework (vLLM PR #48245) marks such output
    stale and passes ``is_stale`` to ``_update_request_with_output``; a vLLM with
    that parameter needs no help.
    """
    import inspect

    params = inspect.signature(async_scheduler_cls._update_request_with_output).parameters
    return "is_stale" not in params


def layer_names_are_hoisted() -> bool:
    """Whether custom ops take layer names as hoisted opaque values (torch >= 2.11).

    Then one compiled piece serves every layer even with a layer-named op inside.
    """
    from vllm.utils import torch_utils

    return bool(getattr(torch_utils, "_USE_LAYERNAME", False))


#: The scheduler's queues of requests waiting for admission: ``waiting`` and
#: ``skipped_waiting`` up to 0.30; ``waiting`` and ``kv_holding_waiting`` from 0.31.
WAITING_QUEUE_NAMES = ("waiting", "skipped_waiting", "kv_holding_waiting")


def waiting_queues(scheduler: object) -> list:
    """The waiting queues this vLLM's scheduler has."""
    return [q for name in WAITING_QUEUE_NAMES if (q := getattr(scheduler, name, None)) is not None]


def admission_cap(scheduler: object) -> int:
    """How many requests may run at once: ``max_num_active_reqs`` from 0.31,
    ``max_num_running_reqs`` before."""
    return getattr(scheduler, "max_num_active_reqs", scheduler.max_num_running_reqs)
