"""A stage whose serving step fails ends its worker process, logged, with its exit code;
a worker whose engine core is gone ends too."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.worker.pipeline.stage_failure import (
    EXIT_CODE,
    EXIT_GRACE_S,
    end_with_parent,
    is_output_rank,
    stopping_worker_on_error,
)


def test_a_failing_step_logs_the_stage_and_exits_the_process(caplog):
    exits = []
    with caplog.at_level(logging.CRITICAL, logger="vllm.pp_cudagraph"):
        with pytest.raises(ValueError, match="boom"):  # only reached if exiting did not
            with stopping_worker_on_error(1, "execute_model", exit_process=exits.append):
                raise ValueError("boom")
    assert exits == [EXIT_CODE]
    record = caplog.records[-1]
    assert "Pipeline stage 1 failed in execute_model" in record.getMessage()
    assert record.exc_info[0] is ValueError


def test_on_the_rank_vllm_reads_a_failing_step_raises_then_ends_the_process(caplog):
    exits, timers = [], []
    with (caplog.at_level(logging.CRITICAL, logger="vllm.pp_cudagraph"),
          pytest.raises(ValueError, match="boom"),
          stopping_worker_on_error(1, "execute_model", replies_to_engine=True,
                                   exit_process=exits.append,
                                   start_timer=lambda delay, action: timers.append(
                                       (delay, action)))):
        raise ValueError("boom")
    assert exits == []  # vLLM's executor reads the raised error first...
    assert "Pipeline stage 1 failed in execute_model" in caplog.records[-1].getMessage()
    [(delay, action)] = timers
    action()  # ...then the process ends, freeing the stages that wait on it
    assert (delay, exits) == (EXIT_GRACE_S, [EXIT_CODE])


@pytest.mark.parametrize("in_ray, expected", [
    (True, [("sleep", EXIT_GRACE_S), EXIT_CODE]),  # Ray forwards its log line first
    (False, [EXIT_CODE]),
])
def test_a_ray_worker_waits_for_its_log_line_to_be_forwarded_before_it_ends(
        monkeypatch, in_ray, expected):
    events = []
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(is_initialized=lambda: in_ray))
    with pytest.raises(ValueError), stopping_worker_on_error(
            0, "execute_model", exit_process=events.append,
            sleep=lambda s: events.append(("sleep", s))):
        raise ValueError("boom")
    assert events == expected


def test_the_rank_vllm_reads_ends_its_process_after_raising():
    script = textwrap.dedent("""
        from vllm_pp_cudagraph.worker.pipeline import stage_failure
        stage_failure.EXIT_GRACE_S = 0.2
        try:
            with stage_failure.stopping_worker_on_error(1, "execute_model",
                                                        replies_to_engine=True):
                raise RuntimeError("injected stage fault")
        except RuntimeError:
            print("raised to the engine", flush=True)
        import time
        time.sleep(30)  # vLLM's worker loop, waiting for the next call
        print("still running")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == EXIT_CODE
    assert "raised to the engine" in proc.stdout
    assert "still running" not in proc.stdout


def test_a_successful_step_changes_nothing():
    exits = []
    with stopping_worker_on_error(0, "sample_tokens", exit_process=exits.append):
        pass
    assert exits == []


def test_the_process_really_ends_with_the_error_in_its_log():
    script = textwrap.dedent("""
        import argparse
        import vllm.logger
        if hasattr(vllm.logger, "configure_logging_from_args"):  # 0.31+
            vllm.logger.configure_logging_from_args(argparse.Namespace())
        from vllm_pp_cudagraph.worker.pipeline.stage_failure import stopping_worker_on_error
        with stopping_worker_on_error(0, "execute_model"):
            raise RuntimeError("injected stage fault")
        print("still running")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    output = proc.stdout + proc.stderr  # vLLM logs to stdout
    assert proc.returncode == EXIT_CODE
    assert "still running" not in output
    assert "injected stage fault" in output
    assert "Pipeline stage 0 failed in execute_model" in output


@pytest.mark.parametrize("pp,pcp,tp", [(2, 1, 1), (4, 1, 1), (2, 1, 2), (3, 2, 2), (2, 2, 4)])
def test_the_rank_that_replies_is_the_one_vllms_executor_reads(pp, pcp, tp):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    executor = SimpleNamespace(world_size=pp * pcp * tp, parallel_config=SimpleNamespace(
        tensor_parallel_size=tp, prefill_context_parallel_size=pcp))
    read = MultiprocExecutor._get_output_rank(executor)
    # vLLM orders ranks (pipeline, prefill context, tensor), tensor fastest.
    replying = [rank for rank in range(pp * pcp * tp)
                if is_output_rank(rank // (pcp * tp) == pp - 1, rank % tp, rank // tp % pcp)]
    assert replying == [read]


@pytest.mark.parametrize("log_stream", ["kept", "gone"])
def test_a_worker_ends_once_the_process_that_started_it_is_gone(tmp_path, log_stream):
    """The engine core exits without ending its worker, which is blocked (as a stage
    waiting on a failed peer is, inside NCCL): the worker ends on its own, saying why
    where its log goes on, and even where its standard output went to the engine core."""
    ready = tmp_path / "watching"
    worker = textwrap.dedent(f"""
        import pathlib, time
        from vllm_pp_cudagraph.worker.pipeline import stage_failure
        stage_failure.EXIT_GRACE_S = 0.1
        stage_failure.end_with_parent(poll_s=0.05)
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(120)
    """)
    stdout = "subprocess.PIPE" if log_stream == "gone" else "None"
    engine_core = textwrap.dedent(f"""
        import os, pathlib, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", {worker!r}], stdout={stdout})
        while not pathlib.Path({str(ready)!r}).exists():
            time.sleep(0.05)
        os._exit(0)  # without ending its worker
    """)
    # The worker holds the captured stderr: the run returns once the worker has ended.
    proc = subprocess.run([sys.executable, "-c", engine_core], capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 0, proc.stderr
    if log_stream == "kept":
        log = proc.stdout + proc.stderr
        assert "The process that started this pipeline worker" in log, log
        assert f"ending the worker (exit {EXIT_CODE})" in log, log


def test_a_worker_ends_even_where_its_output_can_no_longer_be_written(monkeypatch):
    """Its standard output may be a pipe to the engine core that is gone."""
    from vllm_pp_cudagraph.worker.pipeline import stage_failure

    class Gone(io.StringIO):
        def flush(self):
            raise BrokenPipeError

    parents = iter([100])  # the parent at the start; the next read finds it gone
    monkeypatch.setattr(stage_failure.os, "getppid", lambda: next(parents, 1))
    monkeypatch.setattr(sys, "stdout", Gone())
    ended = []
    end_with_parent(exit_process=ended.append, sleep=lambda s: None, poll_s=0.01).join(5)
    assert ended == [EXIT_CODE]


def test_a_worker_whose_parent_lives_is_left_alone():
    ended = []
    thread = end_with_parent(exit_process=ended.append, sleep=lambda s: None, poll_s=0.01)
    thread.join(timeout=0.2)
    assert thread.is_alive() and ended == []
