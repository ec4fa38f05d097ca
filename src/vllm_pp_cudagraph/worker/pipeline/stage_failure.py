"""A pipeline stage that fails while serving stops its worker, so vLLM stops the server."""

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
