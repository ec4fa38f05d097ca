"""A ``vllm serve`` that dies at start-up is reported at once, with its exit code.

On this CPU-only machine the real ``vllm serve`` cannot find a device and exits;
the soak must say so and point at the log instead of polling ``/health`` until
its start-up timeout runs out.
"""

import time
from importlib import metadata

from vllm_pp_cudagraph.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.bench.engine_run import RunSpec
from vllm_pp_cudagraph.bench.serve_load import LoadSpec
from vllm_pp_cudagraph.bench.serve_run import run_serve_mode, serve_command


def test_serve_command_carries_pp_and_graph_mode(tmp_path):
    cmd = serve_command(RunSpec("plugin", "full_decode_only", pp=2), str(tmp_path), 8123)
    assert cmd[cmd.index("--pipeline-parallel-size") + 1] == "2"
    assert any("FULL_DECODE_ONLY" in arg for arg in cmd)


def test_server_that_exits_at_start_is_reported_with_its_exit_code(tmp_path):
    model_dir = str(write_model_dir(tmp_path / "model", tokenizer=True))
    log_path = tmp_path / "serve.log"
    start = time.monotonic()
    report = run_serve_mode(
        RunSpec("plugin", "eager", pp=2),
        model_dir,
        LoadSpec("", "", ["hello"], 1, 1, 1),
        log_path,
        port=8123,
        startup_timeout_s=600,
    )
    assert time.monotonic() - start < 300
    assert "exited with rc=" in report["error"] and "serve.log" in report["error"]
    assert "load" not in report
    assert report["shutdown_clean"] is False
    assert "Traceback" in log_path.read_text()
    # A failed run is where a reader most needs to know what it ran with.
    assert report["spec"]["vllm_version"] == metadata.version("vllm")
    assert report["spec"]["torch_version"] == metadata.version("torch")
