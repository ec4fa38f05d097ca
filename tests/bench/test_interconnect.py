"""``bench --interconnect``: what each simulated link changes, for every runner alike."""

from __future__ import annotations

import json

import pytest

from vllm_pp_cudagraph.commands.bench import cli as bench
from vllm_pp_cudagraph.commands.bench.argument_checks import argument_problems
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, engine_env, engine_kwargs
from vllm_pp_cudagraph.commands.bench.runs import run_spec
from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

NCCL_TRANSPORT = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET")


@pytest.mark.parametrize("runner", ["plugin", "stock", "tp", "v1"])
def test_sockets_narrow_nccl_and_keep_every_transfer_on_it(runner, tmp_path):
    spec = RunSpec(runner, "full_and_piecewise", interconnect="socket")
    env = engine_env(spec)
    assert env["NCCL_P2P_DISABLE"] == env["NCCL_SHM_DISABLE"] == "1"
    assert env["NCCL_NET"] == "Socket"
    assert env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0"
    kwargs = engine_kwargs(spec, str(tmp_path))
    assert kwargs["disable_custom_all_reduce"] is True
    # The graph mode is kept beside the all-reduce fusion's switch.
    assert kwargs["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE",
                                            "pass_config": {"fuse_allreduce_rms": False}}


def test_the_host_link_keeps_shared_memory():
    env = engine_env(RunSpec("stock", "eager", interconnect="host"))
    assert env["NCCL_P2P_DISABLE"] == "1" and "NCCL_SHM_DISABLE" not in env


def test_nvlink_changes_nothing(tmp_path, monkeypatch):
    for name in NCCL_TRANSPORT:
        monkeypatch.delenv(name, raising=False)
    spec = RunSpec("plugin", "piecewise")
    assert not set(NCCL_TRANSPORT) & set(engine_env(spec))
    kwargs = engine_kwargs(spec, str(tmp_path))
    assert "disable_custom_all_reduce" not in kwargs
    assert kwargs["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}


def test_a_served_run_gets_the_same_options_as_flags(tmp_path):
    cmd = serve_command(RunSpec("tp", "full_and_piecewise", interconnect="socket"),
                        str(tmp_path), 8000)
    assert "--disable-custom-all-reduce" in cmd
    config = json.loads(cmd[cmd.index("--compilation-config") + 1])
    assert config["pass_config"] == {"fuse_allreduce_rms": False}


def test_bench_records_the_interconnect_in_each_run(tmp_path):
    args = bench.build_parser().parse_args(["--interconnect", "host", "--out", str(tmp_path)])
    spec = run_spec(args, "plugin", "eager", None, "qwen3-0.6b", None, "x")
    assert spec.interconnect == "host"


@pytest.mark.parametrize("argv, message", [
    (["--interconnect", "infiniband"], "invalid choice"),
    (["--points", "64x256"], "INPUT_LEN:CONCURRENCY"),
    (["--points", "64:0"], "INPUT_LEN:CONCURRENCY"),
])
def test_bad_link_or_points_are_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_points_are_for_the_serve_workload():
    args = bench.build_parser().parse_args(["--points", "64:256", "--workload", "engine"])
    assert any("--points" in p for p in argument_problems(args))
    args = bench.build_parser().parse_args(["--points", "64:256", "--workload", "serve"])
    assert args.points == [(64, 256)]
    assert not any("--points" in p for p in argument_problems(args))


def test_the_executor_reaches_the_engine_and_the_server(tmp_path):
    args = bench.build_parser().parse_args(["--executor", "ray", "--out", str(tmp_path)])
    spec = run_spec(args, "plugin", "eager", None, "qwen3-0.6b", None, "x")
    assert engine_kwargs(spec, str(tmp_path))["distributed_executor_backend"] == "ray"
    cmd = serve_command(spec, str(tmp_path), 8000)
    assert cmd[cmd.index("--distributed-executor-backend") + 1] == "ray"
    default = run_spec(bench.build_parser().parse_args(["--out", str(tmp_path)]),
                       "plugin", "eager", None, "qwen3-0.6b", None, "x")
    assert "distributed_executor_backend" not in engine_kwargs(default, str(tmp_path))


def test_lanes_are_for_the_serve_workload():
    """Lanes meet before serve points only: with another workload they would never meet,
    so the flag is refused before anything starts, naming it."""
    args = bench.build_parser().parse_args(["--lane-sync", "sync", "--workload", "engine"])
    assert "--lane-sync is for --workload serve (lanes meet before each point)" in \
        argument_problems(args)
    args = bench.build_parser().parse_args(["--lane-sync", "sync", "--workload", "serve"])
    assert not any("--lane-sync" in p for p in argument_problems(args))


def test_api_servers_reach_the_server_and_only_serve_takes_them(tmp_path):
    """More API servers lift the one-process bound a small model's server hits; vLLM's
    flag reaches ``vllm serve``, a value no server can use is refused, naming the flag."""
    parser = bench.build_parser()
    args = parser.parse_args(["--api-server-count", "4", "--workload", "serve",
                              "--out", str(tmp_path)])
    assert not argument_problems(args)
    cmd = serve_command(run_spec(args, "plugin", "eager", None, "qwen3-0.6b", None, "x"),
                        str(tmp_path), 8000)
    assert cmd[cmd.index("--api-server-count") + 1] == "4"
    default = run_spec(parser.parse_args(["--out", str(tmp_path)]),
                       "plugin", "eager", None, "qwen3-0.6b", None, "x")
    assert "--api-server-count" not in serve_command(default, str(tmp_path), 8000)
    for argv in (["--api-server-count", "0", "--workload", "serve"],
                 ["--api-server-count", "2", "--workload", "engine"]):
        assert any("--api-server-count" in p for p in argument_problems(parser.parse_args(argv)))
