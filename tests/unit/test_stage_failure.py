"""A stage whose serving step fails ends its worker process, logged, with its exit code."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from vllm_pp_cudagraph.worker.pipeline.stage_failure import EXIT_CODE, stopping_worker_on_error


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
