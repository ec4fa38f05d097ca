"""A pipeline stage that fails while serving ends its worker, so vLLM stops the server rather
than every stage waiting; under the mp executor workers also end with the engine core (NCCL
waits miss its shutdown)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vllm.logger import init_logger

from vllm_pp_cudagraph.shared.heartbeats import flush_logs

logger = init_logger("vllm.pp_cudagraph.stage_failure")

#: Exit status of a worker stopped by a failed step (EX_SOFTWARE).
EXIT_CODE = 70

#: Seconds a failed worker lives on where something must reach the server first: the output
#: rank's raised error, or under Ray the log line, which Ray forwards from another process.
EXIT_GRACE_S = 2.0


def is_output_rank(last_stage: bool, tp_rank: int, pcp_rank: int) -> bool:
    """Whether vLLM reads this rank's step results (``MultiprocExecutor._get_output_rank``)."""
    return last_stage and tp_rank == 0 and pcp_rank == 0


def _start_timer(delay: float, action: Callable[[], None]) -> None:
    timer = threading.Timer(delay, action)
    timer.daemon = True
    timer.start()


def _watch(parent_pid: int, on_gone: Callable[[], None], poll_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    on_gone()


def end_with_parent(exit_process: Callable[[int], None] = os._exit,
                    sleep: Callable[[float], None] = time.sleep,
                    poll_s: float = 1.0) -> threading.Thread:
    """End this worker ``EXIT_GRACE_S`` after its parent exits, unless vLLM ended it first."""
    parent_pid = os.getppid()

    def end() -> None:
        sleep(EXIT_GRACE_S)
        try:
            logger.warning("The process that started this pipeline worker (pid %d) is gone; "
                           "ending the worker (exit %d) so that it does not hold its GPU.",
                           parent_pid, EXIT_CODE)
            flush_logs()
        finally:
            exit_process(EXIT_CODE)

    thread = threading.Thread(target=_watch, args=(parent_pid, end, poll_s), daemon=True,
                              name="pp-cudagraph-parent-watch")
    thread.start()
    return thread


@contextmanager
def stopping_worker_on_error(
        stage: int, what: str, replies_to_engine: bool = False,
        exit_process: Callable[[int], None] = os._exit, sleep: Callable[[float], None] = time.sleep,
        start_timer: Callable[[float, Callable[[], None]], None] = _start_timer) -> Iterator[None]:
    """Run a serving step; on an exception log it and end this worker, or, where vLLM reads
    the result (``replies_to_engine``), raise it and end ``EXIT_GRACE_S`` later."""
    try:
        yield
    except Exception:
        if replies_to_engine:
            logger.critical("Pipeline stage %d failed in %s; vLLM's executor receives the "
                            "error from this rank and shuts the server down.", stage, what)
            # Other stages block on this rank past vLLM's shutdown until this process is gone.
            flush_logs()
            start_timer(EXIT_GRACE_S, lambda: exit_process(EXIT_CODE))
            raise
        logger.critical("Pipeline stage %d failed in %s. Stopping this worker (exit %d) so vLLM "
                        "shuts the server down; under pipeline parallelism it would otherwise "
                        "wait for this stage forever.", stage, what, EXIT_CODE, exc_info=True)
        flush_logs()
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # Ray forwards the log line separately
            sleep(EXIT_GRACE_S)
        exit_process(EXIT_CODE)
        raise
