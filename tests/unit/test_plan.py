"""``vllm-pp-cudagraph plan``: the layouts it predicts, what it recommends, what it refuses."""

from __future__ import annotations

import pytest

from vllm_pp_cudagraph import cli

H200 = ["--gpu-memory-gib", "141"]


def run_plan(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["plan", *argv])
    return code, capsys.readouterr().out


def test_two_gpus_compare_plugin_pp_stock_pp_and_tp(clean_env, capsys):
    code, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", *H200)
    assert code == cli.EXIT_OK
    rows = {line.split("  ")[0].strip() for line in out.splitlines()}
    assert {"plugin PP=2", "stock PP=2", "stock TP=2"} <= rows
    assert "recommended: " in out and "rests on: the bytes/FLOPs model" in out


def test_four_gpus_add_tp_times_pp(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "llama-3.1-70b", "--gpus", "4", *H200)
    assert "plugin TP=2 x PP=2" in out and "stock TP=4" in out


def test_a_model_too_big_for_the_gpus_is_said_not_to_fit(clean_env, capsys):
    code, out = run_plan(capsys, "--model", "llama-3.1-70b", "--gpus", "2",
                         "--gpu-memory-gib", "40")
    assert code == cli.EXIT_OK
    assert out.count("does not fit") == 3
    assert "recommended: none (no layout fits)" in out


def test_a_layout_the_heads_do_not_divide_into_is_named(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "3", *H200)
    line = next(line for line in out.splitlines() if line.startswith("stock TP=3"))
    assert line.endswith("not possible: the model's 16 attention and 8 KV heads do not "
                         "divide by 3")


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "1"], "a plan compares layouts of at least 2 GPUs"),
    (["--gpus", "40"], "the model has 28 decoder layers, fewer than the stages of PP=40"),
    (["--gpus", "2", "--concurrency", "0"], "--concurrency must be at least 1"),
    (["--gpus", "2", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
])
def test_bad_layouts_are_refused_naming_the_flag(clean_env, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "--model", "qwen3-0.6b", *H200, *argv])
    assert exit_.value.code == cli.EXIT_MISCONFIGURED
    assert message in capsys.readouterr().err


def test_without_a_gpu_or_its_memory_the_flag_is_named(clean_env, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_gpu_memory_bytes", lambda: None)
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "qwen3-0.6b", "--gpus", "2"])
    assert "pass --gpu-memory-gib" in capsys.readouterr().err


def test_plan_and_check_agree_on_the_layer_split(clean_env, capsys):
    clean_env.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    clean_env.setattr(cli, "_gpu_count", lambda: 1)
    shape = ["--model", "qwen3-0.6b", "--max-num-seqs", "128", *H200]
    _, planned = run_plan(capsys, *shape, "--gpus", "3")
    cli.main(["check", *shape, "--pp", "3"])
    checked = capsys.readouterr().out
    assert "auto picks 10,10,8 for PP=3" in planned
    assert "auto picks 10,10,8 for PP=3" in checked
