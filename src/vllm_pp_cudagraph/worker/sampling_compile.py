"""The last stage's top-k/top-p kernels, compiled on a thread beside the profiling run."""

from __future__ import annotations

import threading
import time

import torch
from vllm.logger import init_logger

from vllm_pp_cudagraph.shared import vllm_surface

logger = init_logger("vllm.pp_cudagraph.runner")


class SamplingCompile:
    """Compiles the sampler's Triton kernels while the profiling run compiles the model, so
    a cold start does not pay for both in turn; vLLM's warm-up then finds them compiled.
    :meth:`wait` must return before anything samples: vLLM's kernel owners hold warm-up
    state per call, which a sampling call on another thread would read."""

    def __init__(self, vllm_config, device: torch.device):
        self.registry = vllm_surface.jit_warmup_registry(vllm_config)  # these kernels alone
        self.device = device
        self.error: Exception | None = None
        self.compile_s = 0.0
        self._thread = threading.Thread(target=self._compile, name="sampling-kernel-compile",
                                        daemon=True)

    def start(self) -> SamplingCompile | None:
        """Begin compiling; None where this release registers no sampling kernels."""
        if not vllm_surface.register_sampling_warm_ups(self.registry):
            return None
        self._thread.start()
        return self

    def _compile(self) -> None:
        started = time.monotonic()
        try:
            if self.device.type == "cuda":  # Triton compiles for the thread's current device
                torch.cuda.set_device(self.device)
            self.registry.warmup()
        except Exception as error:  # vLLM's own warm-up compiles what is missing
            self.error = error
        self.compile_s = time.monotonic() - started

    def wait(self) -> None:
        started = time.monotonic()
        self._thread.join()
        if self.error is not None:
            logger.warning("Compiling the sampler's top-k/top-p kernels beside the profiling "
                           "run failed (%s); vLLM's warm-up compiles them.", self.error)
        else:
            logger.info("Compiled the sampler's top-k/top-p kernels beside the profiling run "
                        "in %.2f s (%.2f s of it waited for)", self.compile_s,
                        time.monotonic() - started)
