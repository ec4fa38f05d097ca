"""A pipeline stage that fails while serving stops its worker, so vLLM stops the server.

Under pipeline parallelism vLLM's multiprocess executor collects step results
from the last stage only. A worker of any other stage that raises inside a
step logs the exception and returns to its loop; the last stage then waits for
tensors that never come, and the engine, the API server and every other
worker wait with it. vLLM does stop everything when a worker *process* dies
(its worker monitor shuts the executor down and fails the engine). So a stage
that fails inside a step logs the error with its stage and exits its process
with :data:`EXIT_CODE`; vLLM's own shutdown does the rest.

Only steps of a pipeline-parallel runner are covered: there the runner always
lives in a worker process of its own. Start-up errors already reach the engine
through vLLM's collective calls and stop it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vllm.logger import init_logger

logger = init_logger("vllm.pp_cudagraph.stage_failure")

#: Exit status of a worker stopped by a failed step (EX_SOFTWARE).
EXIT_CODE = 70


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers + logging.getLogger("vllm").handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - best effort before exiting
            pass
    sys.stdout.flush()
    sys.stderr.flush()


@contextmanager
def stopping_worker_on_error(
    stage: int, what: str, exit_process: Callable[[int], None] = os._exit
) -> Iterator[None]:
    """Run a serving step; on an exception log it and end this worker process."""
    try:
        yield
    except Exception:
        logger.critical(
            "Pipeline stage %d failed in %s. Stopping this worker (exit %d) so vLLM "
            "shuts the server down; under pipeline parallelism it would otherwise "
            "wait for this stage forever.",
            stage,
            what,
            EXIT_CODE,
            exc_info=True,
        )
        _flush_logs()
        exit_process(EXIT_CODE)
        raise
