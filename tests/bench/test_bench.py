"""The benchmark's workload, statistics and report (the GPU run itself is not faked)."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

from vllm_pp_cudagraph.commands.bench import cli as bench
from vllm_pp_cudagraph.commands.bench import runs as bench_runs
from vllm_pp_cudagraph.commands.bench.argument_checks import argument_problems
from vllm_pp_cudagraph.commands.bench.arguments import DEFAULT_MODES, parse_modes
from vllm_pp_cudagraph.commands.bench.engine_run import (
    RunSpec,
    log_findings,
    make_prompts,
    output_lengths,
)
from vllm_pp_cudagraph.commands.bench.judging import check_agreement, expected_difference, plugin_not_loaded
from vllm_pp_cudagraph.commands.bench.report import (
    across_engines,
    disagreement_lines,
    print_findings,
    render_table,
    write_plot,
)
from vllm_pp_cudagraph.commands.bench.runs import engine_status, run_spec, serve_load_spec
from vllm_pp_cudagraph.commands.bench.stats import (
    RequestTiming,
    capture_stats,
    median_run,
    output_digest,
    percentile,
    summarize_requests,
)
from vllm_pp_cudagraph.commands.cli.exit_status import EXIT_NO_GPU


def report(runner, mode, digest="d1", **extra):
    return {"spec": {"runner": runner, "mode": mode}, "digest": digest, "req_per_s": 10.0, **extra}


def test_help_works_without_a_gpu():
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.commands.cli", "bench", "--help"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for option in ("--model", "--pp", "--prompts", "--input-len", "--output-len",
                   "--max-num-seqs", "--modes", "--repeat"):
        assert option in proc.stdout


def test_every_option_has_help_with_its_default():
    parser = bench.build_parser()
    options = [a for a in parser._actions if a.dest != "help"]
    assert [a.option_strings for a in options if not a.help] == []
    text = parser.format_help()
    assert text.count("(default:") == len(options)
    assert "eager" in text and "full_decode_only" in text  # --modes names its choices


def test_without_enough_gpus_bench_refuses_at_once_and_writes_nothing(tmp_path, monkeypatch):
    """The no-GPU run a new user makes: a clear message naming the GPUs needed,
    non-zero exit, no checkpoint written, no engine started."""
    out = tmp_path / "results"
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}
    started = __import__("time").monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.commands.cli", "bench", "--pp", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == EXIT_NO_GPU  # as `check` says no GPU is visible
    assert "--pp 2 needs 2 NVIDIA GPUs" in proc.stderr and "0 are visible" in proc.stderr
    assert not out.exists()
    assert __import__("time").monotonic() - started < 30


def test_default_modes_cover_plugin_stock_and_v1():
    modes = parse_modes(",".join(DEFAULT_MODES))
    assert ("v1", "full_and_piecewise", None) in modes
    for mode in ("eager", "piecewise", "full_and_piecewise", "full_decode_only", "breakable"):
        assert ("plugin", mode, None) in modes and ("stock", mode, None) in modes


def test_mode_may_carry_its_own_memory_utilization():
    assert parse_modes("plugin:full_and_piecewise@0.92") == [
        ("plugin", "full_and_piecewise", 0.92)
    ]


@pytest.mark.parametrize(
    "bad", ["plugin", "plugin:fast", "v3:eager", "plugin:eager,", "plugin:eager@x", "plugin:eager@1.5"]
)
def test_bad_modes_are_rejected_with_the_choices(bad):
    with pytest.raises(argparse.ArgumentTypeError, match=r"RUNNER:MODE\[@UTIL\]"):
        parse_modes(bad)


def test_workload_is_deterministic_and_shaped():
    prompts = make_prompts(128, 2)
    assert prompts == make_prompts(128, 2)
    assert len(prompts) == 128 and all(len(p) == 2 for p in prompts)
    assert prompts != make_prompts(128, 2, seed=1)


def test_without_a_spread_every_request_decodes_the_same_length():
    assert output_lengths(RunSpec("stock", "eager", prompts=4, output_len=64)) == [64] * 4


def test_a_spread_staggers_when_requests_finish():
    lengths = output_lengths(RunSpec("stock", "eager", prompts=256, output_len=256,
                                     output_len_spread=128))
    assert len(lengths) == 256 and min(lengths) == 128 and max(lengths) == 256
    assert len(set(lengths)) == 129  # every length in the range, so finishes are spread out
    with pytest.raises(ValueError, match="output_len_spread=256 must be below output_len=256"):
        output_lengths(RunSpec("stock", "eager", output_len=256, output_len_spread=256))


def test_bench_refuses_a_spread_as_long_as_the_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 2)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--output-len", "64", "--output-len-spread", "64", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--output-len-spread=64 must be at least 0 and below --output-len=64" in capsys.readouterr().err


def test_output_digest_depends_on_order_and_content():
    assert output_digest([[1, 2], [3]]) != output_digest([[3], [1, 2]])
    assert output_digest([[1, 2], [3]]) != output_digest([[1], [2, 3]])


def test_percentile_matches_linear_interpolation():
    values = list(range(1, 101))
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 99))


def test_request_summary_in_milliseconds():
    timings = [
        RequestTiming(0.010, 100.0, 100.0 + 0.005 * 9, 10),  # TPOT 5 ms
        RequestTiming(0.030, 200.0, 200.0 + 0.007 * 9, 10),  # TPOT 7 ms
        RequestTiming(0.020, 300.0, 300.0, 1),  # single token: no TPOT
    ]
    summary = summarize_requests(timings)
    assert summary["ttft_mean_ms"] == pytest.approx(20.0)
    assert summary["tpot_mean_ms"] == pytest.approx(6.0)
    assert summary["tpot_p99_ms"] == pytest.approx(6.98)


def test_median_run_is_the_middle_elapsed():
    runs = [{"elapsed_s": 3.0, "k": "c"}, {"elapsed_s": 1.0, "k": "a"}, {"elapsed_s": 2.0, "k": "b"}]
    assert median_run(runs)["k"] == "b"
    passes = [{"req_per_s": 5.0}, {"req_per_s": 9.0}, {"req_per_s": 7.0}]
    assert median_run(passes, key="req_per_s")["req_per_s"] == 7.0
    with pytest.raises(ValueError):
        median_run([])


def test_spread_is_the_range_over_the_fastest_run():
    from vllm_pp_cudagraph.commands.bench.stats import spread_pct

    assert spread_pct([{"elapsed_s": 10.5}, {"elapsed_s": 6.78}, {"elapsed_s": 8.04}]) == 54.9
    assert spread_pct([{"elapsed_s": 2.0}]) is None


def test_capture_stats_take_the_slowest_stage():
    log = (
        "(Worker_PP0) INFO Graph capturing finished in 1 secs, took 0.13 GiB\n"
        "(Worker_PP1) INFO Graph capturing finished in 5 secs, took 0.16 GiB\n"
    )
    assert capture_stats(log) == {"capture_s": 5.0, "graph_gib": 0.16}
    assert capture_stats("eager run") == {"capture_s": None, "graph_gib": None}


def test_agreement_uses_stock_as_reference_per_token_family():
    reports = [
        report("plugin", "piecewise", "c1"),
        report("stock", "piecewise", "c1"),
        report("plugin", "full_and_piecewise", "c2"),  # differs from compiled reference
        report("plugin", "breakable", "e1"),
        report("stock", "eager", "e1"),
        report("v1", "full_and_piecewise", "c1"),
        report("plugin", "eager", None),  # failed run
        report("plugin", "full_decode_only", "c3"),  # same as stock in its own mode
        report("stock", "full_decode_only", "c3"),
    ]
    check_agreement(reports)
    agree = {(r["spec"]["runner"], r["spec"]["mode"]): r["tokens_agree"] for r in reports}
    assert agree == {
        ("plugin", "piecewise"): True,
        ("stock", "piecewise"): True,
        ("plugin", "full_and_piecewise"): False,
        ("plugin", "breakable"): True,
        ("stock", "eager"): True,
        ("v1", "full_and_piecewise"): True,
        ("plugin", "eager"): None,
        ("plugin", "full_decode_only"): True,
        ("stock", "full_decode_only"): True,
    }
    assert reports[3]["tokens_reference"] == "stock:eager"
    assert reports[5]["tokens_reference"] == "stock:piecewise"
    assert reports[7]["tokens_reference"] == "stock:full_decode_only"


def test_a_second_stock_run_is_checked_against_the_first():
    first, second = report("stock", "eager", "e1"), report("stock", "eager", "e9")
    plugin = report("plugin", "eager", "e1")
    check_agreement([first, second, plugin])
    assert (first["tokens_agree"], second["tokens_agree"], plugin["tokens_agree"]) == (True, False, True)


def test_agreement_counts_the_requests_that_differ():
    stock = report("stock", "eager", "e1", request_digests=["a", "b", "c", "d"])
    plugin = report("plugin", "eager", "e2", request_digests=["a", "x", "c", "y"])
    check_agreement([plugin, stock])
    assert plugin["tokens_agree"] is False and plugin["requests_differ"] == 2
    assert stock["requests_differ"] == 0


def test_an_engine_that_does_not_repeat_its_own_tokens_does_not_agree():
    stock = report("stock", "piecewise", "c1", run_digests=["c1", "c1", "c1"])
    plugin = report("plugin", "piecewise", "c1", run_digests=["c1", "c7", "c1"])
    check_agreement([stock, plugin])
    assert stock["repeats_itself"] and stock["tokens_agree"]
    assert plugin["repeats_itself"] is False and plugin["tokens_agree"] is False


def test_a_disagreement_under_the_measured_cadence_names_the_runner_that_keeps_stocks_batches():
    stock = report("stock", "piecewise", "c1", run_digests=["c1"])
    plugin = report("plugin", "piecewise", "c2", run_digests=["c3"])
    fixed = report("plugin-cadence", "piecewise", "c4", run_digests=["c4"])
    check_agreement([stock, plugin, fixed])
    lines = disagreement_lines([stock, plugin, fixed])
    assert len(lines) == 2
    assert lines[0].startswith("TOKENS DIFFER: plugin:piecewise gave other tokens in its timed")
    assert "run plugin-cadence:piecewise" in lines[0]
    # on vLLM's cadence a difference is the plugin's own: no hint away from it
    assert lines[1].startswith("TOKENS DIFFER: plugin-cadence:piecewise vs stock:piecewise")
    assert "decode cadence" not in lines[1]


def test_runs_given_several_times_are_summarised_across_engines():
    def run(runner, req_per_s, digest="c1", util=0.5):
        r = report(runner, "full_and_piecewise", digest, req_per_s=req_per_s)
        r["spec"]["gpu_memory_utilization"] = util
        return r

    reports = [run("v1", 60.0), run("plugin", 57.0), run("v1", 54.0), run("plugin", 66.0),
               run("v1", 56.0), run("plugin", None, digest=None), run("stock", 50.0),
               run("plugin", 40.0, util=0.92)]
    rows = {row["run"]: row for row in across_engines(reports)}
    assert set(rows) == {"v1:full_and_piecewise@0.5", "plugin:full_and_piecewise@0.5"}
    v1, plugin = rows["v1:full_and_piecewise@0.5"], rows["plugin:full_and_piecewise@0.5"]
    assert (v1["engines"], v1["median_req_per_s"], v1["min_req_per_s"], v1["max_req_per_s"]) == (
        3, 56.0, 54.0, 60.0)
    assert (plugin["engines"], plugin["median_req_per_s"]) == (2, 61.5)  # the failed one left out


def test_table_shows_values_failures_and_disagreement():
    ok = report("plugin", "piecewise", "c1", output_tok_per_s=5120.0, tpot_mean_ms=3.456,
                tokens_verdict="identical")
    bad = report("plugin", "eager", None, req_per_s=None, tokens_verdict=None)
    tie = report("stock", "piecewise", "c3", tokens_verdict="near-ties")
    differ = report("stock", "piecewise", "c2", tokens_verdict="differ")
    table = render_table([ok, bad, tie, differ]).splitlines()
    assert table[0].split()[:4] == ["run", "req/s", "spread", "%"]
    assert "plugin:piecewise" in table[2] and "10.00" in table[2] and "3.46" in table[2]
    assert table[2].rstrip().endswith("identical")
    assert "FAILED" in table[3]
    assert table[4].rstrip().endswith("near-ties")
    assert table[5].rstrip().endswith("differ")


def test_plot_is_a_png_when_matplotlib_is_there(tmp_path):
    reports = [report("plugin", "piecewise", tpot_mean_ms=3.0), report("stock", "piecewise", tpot_mean_ms=5.0)]
    path = tmp_path / "bench.png"
    if write_plot(reports, path):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not path.exists()


def test_serve_command_carries_mode_and_model_settings():
    from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec
    from vllm_pp_cudagraph.commands.bench.serve_run import mode_cli_args, serve_command

    assert mode_cli_args("eager") == ["--enforce-eager"]
    assert mode_cli_args("full_decode_only") == [
        "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'
    ]
    cmd = serve_command(RunSpec("plugin", "piecewise", pp=2, max_num_seqs=64), "/m", 8123)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/m"]
    text = " ".join(cmd)
    for part in ("--pipeline-parallel-size 2", "--max-num-seqs 64", "--port 8123",
                 "--load-format auto", "--attention-backend TRITON_ATTN",
                 '--compilation-config {"cudagraph_mode": "PIECEWISE"}'):
        assert part in text
    dummy = serve_command(RunSpec("plugin", "eager", weights="dummy"), "/m", 8123)
    assert "--load-format dummy" in " ".join(dummy)


def test_serve_load_uses_the_benchmark_prompts_as_words():
    args = bench.build_parser().parse_args(["--serve", "--prompts", "4", "--input-len", "3"])
    spec = serve_load_spec(args)
    assert spec.num_requests == 4 and spec.stream_fraction == 1.0 and spec.cancel_fraction == 0.0
    assert [len(p.split()) for p in spec.prompts] == [3, 3, 3, 3]
    assert spec.prompts[0].split()[0] == f"w{make_prompts(4, 3)[0][0]}"


def test_one_batch_generation_calls_what_vllms_llm_offers():
    """The queue-then-run sequence uses LLM methods with these exact parameters."""
    import inspect

    from vllm import LLM

    params = {name: set(inspect.signature(getattr(LLM, name)).parameters)
              for name in ("sleep", "enqueue", "wake_up", "wait_for_completion")}
    assert {"level"} <= params["sleep"]
    assert {"prompts", "sampling_params", "use_tqdm"} <= params["enqueue"]
    assert {"tags"} <= params["wake_up"]
    assert {"use_tqdm"} <= params["wait_for_completion"]


def test_engine_status_tells_a_stopped_engine_from_a_failed_one():
    ran = {"digest": "01c2acb7", "req_per_s": 68.07, "tpot_mean_ms": 3.57, "returncode": 0}
    assert engine_status(ran, "plugin-piecewise") == "68.07 req/s, TPOT 3.57 ms"
    served = {"digest": "n/a", "req_per_s": 47.814766, "tpot_p50_ms": 75.535, "returncode": 0}
    assert engine_status(served, "plugin") == "47.81 req/s, TPOT 75.53 ms"  # serve: p50
    stopped = {"returncode": -6, "timed_out_after_s": 72.19}
    line = engine_status(stopped, "v1-full_and_piecewise")
    assert line.startswith("STOPPED after 72 s") and "--deadline" in line
    assert "v1-full_and_piecewise.log" in line
    assert engine_status({"returncode": 1}, "x") == "FAILED (rc=1, see x.log)"


def test_every_runner_sets_only_settings_the_plugin_accepts():
    from vllm_pp_cudagraph.commands.bench.engine_run import RUNNERS
    from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

    settings = {name: PPCudaGraphSettings.from_env(env) for name, env in RUNNERS.items()}
    assert settings["plugin"] == PPCudaGraphSettings.from_env({})
    both = settings["plugin-cadence-kvsplit"]
    assert both.decode_cadence == "vllm" and not both.kv_update_in_graphs
    assert settings["plugin-cadence"].decode_cadence == "vllm"
    assert settings["plugin-merge"].decode_cadence == "merge"
    assert settings["plugin-fill"].decode_cadence == "fill"
    assert settings["plugin-cadence"].kv_update_in_graphs


def test_serve_workload_drives_vllms_own_client_with_flags_it_accepts(tmp_path):
    """The command must parse with the installed vLLM's `vllm bench serve` parser."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_pp_cudagraph.commands.bench.serve_run import vllm_bench_serve_command

    cmd = vllm_bench_serve_command("http://127.0.0.1:8000", "/models/m", 32, 500, 64, 256,
                                   tmp_path, "c32.json")
    assert cmd[1:6] == ["-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(cmd[5:])
    assert (args.max_concurrency, args.num_prompts, args.random_input_len,
            args.random_output_len) == (32, 500, 64, 256)
    assert args.dataset_name == "random" and args.save_result and args.ignore_eos
    assert args.percentile_metrics == "ttft,tpot,itl" and args.metric_percentiles == "50,99"


def test_serve_workload_reports_throughput_and_p50_p99_latencies():
    from vllm_pp_cudagraph.commands.bench.serve_run import vllm_bench_summary

    result = {"request_throughput": 81.2, "output_throughput": 20787.0, "completed": 1000,
              "failed": 0, "median_ttft_ms": 40.0, "p99_ttft_ms": 210.5, "median_tpot_ms": 9.1,
              "p99_tpot_ms": 12.0, "median_itl_ms": 8.8, "p99_itl_ms": 30.2}
    summary = vllm_bench_summary(result)
    assert summary["req_per_s"] == 81.2 and summary["completed"] == 1000
    assert (summary["ttft_p99_ms"], summary["itl_p99_ms"], summary["tpot_p50_ms"]) == (
        210.5, 30.2, 9.1)


def test_workload_and_concurrency_sweep_are_parsed():
    args = bench.build_parser().parse_args(["--workload", "serve", "--concurrency", "16,64,200"])
    assert args.workload == "serve" and args.concurrency == [16, 64, 200]
    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--concurrency", "0,x"])
    assert bench.build_parser().parse_args([]).workload == "batch"


@pytest.mark.parametrize("flags, message", [
    (["--pp", "0"], "--pp 0 must be at least 1 (1 runs without a pipeline"),
    (["--prompts", "0"], "--prompts 0 must be at least 1"),
    (["--input-len", "-3"], "--input-len -3 must be at least 1"),
    (["--output-len", "0"], "--output-len 0 must be at least 1"),
    (["--max-num-seqs", "0"], "--max-num-seqs 0 must be at least 1"),
    (["--repeat", "-1"], "--repeat -1 must be at least 0"),
    (["--num-requests", "0"], "--num-requests 0 must be at least 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5 must be in (0, 1]"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization 0.0 must be in (0, 1]"),
    (["--timeout", "0"], "--timeout 0.0 must be positive"),
    (["--deadline", "30"], "--deadline 30.0 leaves no engine time to run"),
    (["--port", "70000"], "--port 70000 must be in 1..65535"),
    (["--model", "qwen3-30b-a3b"], "--model qwen3-30b-a3b has no random checkpoint (MoE, or too big"),
    (["--model", "qwen3-32b"], "--model qwen3-32b has no random checkpoint (MoE, or too big to "
                               "write); add --weights dummy"),
    (["--model", "/nonexistent"], "--model /nonexistent is neither a model directory nor a "
                                  "built-in shape (llama-3.1-70b, qwen3-0.6b,"),
    (["--model", "qwen3-0.6"], "--model qwen3-0.6 is neither a model directory"),
    (["--tp", "0"], "--tp 0 must be at least 1"),
    (["--layer-partition", "14,0"], "bad --layer-partition '14,0'"),
    (["--layer-partition", "10,9,9"], "--layer-partition 10,9,9 must name 2 stages (--pp)"),
    (["--layer-partition", "10,10"], "--layer-partition 10,10 splits 20 layers; --model "
                                     "qwen3-0.6b has 28"),
    (["--speculative-config", "ngram"], "bad --speculative-config 'ngram': use a JSON object"),
    (["--speculative-config", "[3]"], "bad --speculative-config '[3]'"),
    (["--speculative-config", '{"num_speculative_tokens": 3}'], 'with a "method"'),
    (["--kv-transfer-config", '{"kv_role": "kv_both"}'], 'with a "kv_connector"'),
    (["--near-tie-nats", "-1"], "--near-tie-nats -1.0 must be at least 0"),
    (["--workload", "serve", "--request-rate", "0"], "--request-rate 0.0 must be above 0"),
    (["--request-rate", "10"], "--request-rate applies to --workload serve only"),
])
def test_impossible_arguments_are_refused_before_anything_starts(flags, message, tmp_path,
                                                                 capsys, monkeypatch):
    """Refused with the flag named and exit status 2, whatever GPUs there are; no
    directory, checkpoint or engine is made."""
    monkeypatch.setattr(bench, "visible_gpus", lambda: 8)
    monkeypatch.setattr(bench_runs, "write_model_dir", lambda *a, **k: pytest.fail("wrote a model"))
    monkeypatch.setattr(bench_runs, "run_in_subprocess", lambda *a, **k: pytest.fail("started"))
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*flags, "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not out.exists()


def test_every_impossible_argument_is_named_at_once(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--pp", "0", "--prompts", "0", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert "--pp 0 must be" in err and "--prompts 0 must be" in err
    assert "Nothing was started or written." in err


def test_pp_above_the_visible_gpus_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 2)
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--pp", "4", "--out", str(out)])
    assert exit_info.value.code == EXIT_NO_GPU
    assert "--pp 4 needs 4 NVIDIA GPUs (one per pipeline stage) but 2 are visible" in \
        capsys.readouterr().err
    assert not out.exists()


def test_a_model_directory_or_a_hub_id_is_taken_as_the_model(tmp_path):
    parser = bench.build_parser()
    for model in (str(tmp_path), "Qwen/Qwen3-0.6B"):
        assert argument_problems(parser.parse_args(["--model", model])) == []


def _refused(monkeypatch, capsys, gpus: int, argv: list[str]) -> tuple[int, str]:
    """bench's exit code and stderr for ``argv`` with ``gpus`` visible, where it refuses."""
    monkeypatch.setattr(bench, "visible_gpus", lambda: gpus)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    return exit_info.value.code, capsys.readouterr().err


def test_arguments_are_checked_before_the_gpus_are_counted(tmp_path, capsys, monkeypatch):
    """On a machine without GPUs a wrong argument is named, not only the GPU count."""
    code, err = _refused(monkeypatch, capsys, 0,
                         ["--pp", "2", "--model", "/nonexistent", "--out", str(tmp_path / "r")])
    assert code == 2
    assert "--model /nonexistent is neither a model directory" in err
    assert "NVIDIA GPUs" not in err


@pytest.mark.parametrize("gpus", [0, 1])
def test_too_few_gpus_for_the_least_pp_advise_only_another_host(gpus, tmp_path, capsys,
                                                                monkeypatch):
    """At --pp 2 no lower --pp is accepted, so the message must not advise one."""
    monkeypatch.setattr(bench, "visible_gpus", lambda: gpus)
    with pytest.raises(SystemExit):
        bench.main(["--pp", "2", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert "Run it on a host with at least 2 NVIDIA GPUs" in err
    assert "--pp" not in err.split("visible.")[1]


def test_the_pp_advised_for_the_gpus_at_hand_is_accepted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "visible_gpus", lambda: 3)
    with pytest.raises(SystemExit):
        bench.main(["--pp", "4", "--out", str(tmp_path / "r")])
    advised = re.search(r"with --pp (\d+) or fewer", capsys.readouterr().err).group(1)
    assert advised == "3"
    code = _bench_with_engines_faked(monkeypatch, ["--pp", advised, "--weights", "dummy",
                                                   "--modes", "stock:eager",
                                                   "--out", str(tmp_path / "r")], gpus=3)
    assert code == 0


def test_tensor_parallel_stages_need_pp_times_tp_gpus(tmp_path, capsys, monkeypatch):
    code, err = _refused(monkeypatch, capsys, 2,
                         ["--pp", "2", "--tp", "2", "--out", str(tmp_path / "r")])
    assert code == EXIT_NO_GPU
    assert "--pp 2 --tp 2 needs 4 NVIDIA GPUs (2 per pipeline stage) but 2 are visible" in err
    assert "or with --tp 1" in err
    code = _bench_with_engines_faked(monkeypatch, ["--pp", "2", "--tp", "1", "--weights", "dummy",
                                                   "--modes", "stock:eager",
                                                   "--out", str(tmp_path / "r")])
    assert code == 0


def test_each_runs_spec_records_its_layout_backend_and_speculation(tmp_path, monkeypatch):
    """What a layouts comparison reads from bench.json, for every workload."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    _bench_with_engines_faked(
        monkeypatch, ["--workload", "engine", "--weights", "dummy", "--modes", "stock:eager",
                      "--pp", "4", "--tp", "2", "--layer-partition", "8,7,7,6",
                      "--speculative-config", json.dumps(ngram), "--out", str(tmp_path)], gpus=8)
    run = json.loads((tmp_path / "bench.json").read_text())["runs"][0]
    spec = run["spec"]
    assert (spec["pp"], spec["tp"], spec["layer_partition"]) == (4, 2, [8, 7, 7, 6])
    assert spec["attention_backend"] is None and spec["speculative_config"] == ngram
    assert "tokens_agree" in run and run["tokens_agree"] is None  # engine: not compared


def test_a_layout_reaches_the_engine_the_server_and_the_environment(monkeypatch):
    import vllm.platforms
    from _serve_parser import parse_serve_args

    from vllm_pp_cudagraph.commands.bench.engine_run import engine_env, engine_kwargs
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    connector = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    spec = RunSpec("plugin", "piecewise", pp=4, tp=2, layer_partition=[8, 7, 7, 6],
                   speculative_config=ngram, kv_transfer_config=connector,
                   async_scheduling=False)
    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")  # for the parser
    kwargs = engine_kwargs(spec, "/m")
    assert (kwargs["pipeline_parallel_size"], kwargs["tensor_parallel_size"]) == (4, 2)
    assert kwargs["speculative_config"] == ngram
    assert kwargs["kv_transfer_config"] == connector and kwargs["async_scheduling"] is False
    assert engine_env(spec)["VLLM_PP_LAYER_PARTITION"] == "8,7,7,6"
    served = parse_serve_args(serve_command(spec, "/m", 8000)[4:])
    assert (served.pipeline_parallel_size, served.tensor_parallel_size) == (4, 2)
    assert json.loads(json.dumps(served.speculative_config)) == ngram
    assert served.kv_transfer_config.kv_connector == "ExampleConnector"
    assert served.async_scheduling is False
    # vLLM's own split when none is asked for, whatever this shell has set
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "20,8")
    plain = RunSpec("plugin", "piecewise")
    assert "VLLM_PP_LAYER_PARTITION" not in engine_env(plain)
    assert not {"speculative_config", "kv_transfer_config", "async_scheduling"} & set(
        engine_kwargs(plain, "/m"))
    assert "--speculative-config" not in serve_command(plain, "/m", 8000)
    assert parse_serve_args(serve_command(plain, "/m", 8000)[4:]).async_scheduling is None


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise", "eager"])
def test_deterministic_compile_and_max_model_len_reach_the_engine_and_the_server(
        mode, monkeypatch):
    """``--deterministic-compile`` asks Inductor not to time kernels (a vLLM setting and
    the environment its workers inherit), keeping the mode's graph settings;
    ``--max-model-len`` is vLLM's. Neither is set unless asked, whatever the shell says."""
    import vllm.platforms
    from _serve_parser import parse_serve_args

    from vllm_pp_cudagraph.commands.bench.engine_run import MODES, engine_env, engine_kwargs
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    args = bench.build_parser().parse_args(["--deterministic-compile", "--max-model-len",
                                            "4096", "--modes", f"plugin:{mode}"])
    spec = run_spec(args, "plugin", mode, None, "qwen3-0.6b", None, "x")
    kwargs = engine_kwargs(spec, "/m")
    served = parse_serve_args(serve_command(spec, "/m", 8000)[4:])
    assert kwargs["max_model_len"] == served.max_model_len == 4096
    assert engine_env(spec)["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    graphs = MODES[mode][0].get("compilation_config", {})
    if MODES[mode][0].get("enforce_eager"):
        assert "compilation_config" not in kwargs and served.enforce_eager
    else:
        assert kwargs["compilation_config"] == {
            **graphs, "inductor_compile_config": {"deterministic": True}}
        assert served.compilation_config.inductor_compile_config["deterministic"] is True
        assert served.compilation_config.cudagraph_mode.name == graphs["cudagraph_mode"]
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", "1")
    plain = run_spec(bench.build_parser().parse_args([]), "plugin", mode, None,
                     "qwen3-0.6b", None, "x")
    assert "TORCHINDUCTOR_DETERMINISTIC" not in engine_env(plain)
    assert "max_model_len" not in engine_kwargs(plain, "/m")
    assert engine_kwargs(plain, "/m").get("compilation_config") == MODES[mode][0].get(
        "compilation_config")


@pytest.mark.parametrize("mode", ["full_and_piecewise", "eager"])
def test_a_larger_capture_size_reaches_the_engine_and_the_server(mode, monkeypatch):
    """``--max-cudagraph-capture-size`` is vLLM's, for every runner alike and beside the
    mode's graph settings; eager captures nothing, and a size no engine takes is refused."""
    import vllm.platforms
    from _serve_parser import parse_serve_args

    from vllm_pp_cudagraph.commands.bench.engine_run import MODES, engine_kwargs
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")
    parser = bench.build_parser()
    args = parser.parse_args(["--max-cudagraph-capture-size", "1024", "--max-num-seqs",
                              "1024", "--modes", f"plugin:{mode}"])
    assert argument_problems(args) == []
    for runner in ("plugin", "stock"):
        spec = run_spec(args, runner, mode, None, "qwen3-0.6b", None, "x")
        kwargs = engine_kwargs(spec, "/m")
        served = parse_serve_args(serve_command(spec, "/m", 8000)[4:])
        if MODES[mode][0].get("enforce_eager"):
            assert "compilation_config" not in kwargs and served.enforce_eager
            continue
        assert kwargs["compilation_config"] == {
            **MODES[mode][0]["compilation_config"], "max_cudagraph_capture_size": 1024}
        assert served.compilation_config.max_cudagraph_capture_size == 1024
    assert any("--max-cudagraph-capture-size 0 must be at least 1" in problem for problem in
               argument_problems(parser.parse_args(["--max-cudagraph-capture-size", "0"])))


def test_each_pass_gets_its_stages_step_time_from_the_snapshots_around_it():
    """A pass's step time per stage is the mean over the steps timed between the readings
    before and after it, not the last window (which a run's drain closes)."""
    from vllm_pp_cudagraph.commands.bench.serve_run import stages_over
    from vllm_pp_cudagraph.shared.snapshots import StageSnapshot

    def snap(stage: int, steps: int, busy_ms: float, idle_ms: float) -> StageSnapshot:
        return StageSnapshot(stage=stage, pp_size=2, tp_size=1, time=0.0, window_s=5.0,
                             steps=10, busy_fraction=1.0, wait_fraction=0.0, step_ms=20.0,
                             handoff_bytes_total=0, graph_steps_total=steps,
                             eager_steps_total=0, timed_steps_total=steps,
                             busy_ms_total=busy_ms, idle_ms_total=idle_ms, layers=32)

    before = {0: snap(0, 100, 2_000.0, 0.0), 1: snap(1, 100, 2_500.0, 100.0)}
    after = {0: snap(0, 1_100, 44_000.0, 0.0), 1: snap(1, 1_100, 42_500.0, 4_100.0)}
    assert stages_over(before, after) == {"stage_step_ms": [42.0, 40.0],
                                          "stage_busy": [1.0, 0.909]}
    # From a server's start; and nothing where a stage timed no step (stock writes none).
    assert stages_over({}, after)["stage_step_ms"] == [40.0, round(42_500 / 1_100, 2)]
    assert stages_over(after, after) == {"stage_step_ms": None, "stage_busy": None}
    assert stages_over({}, {}) == {"stage_step_ms": None, "stage_busy": None}


def test_speculative_acceptance_is_summed_over_engines_from_vllms_counters():
    from vllm.v1.metrics.reader import Counter, Gauge, Vector

    from vllm_pp_cudagraph.commands.bench.engine_run import spec_decode_stats

    def counter(name, value, engine):
        return Counter(f"vllm:spec_decode_num_{name}", {"engine": engine}, value)

    metrics = [Gauge("vllm:num_requests_running", {}, 3.0)]
    for engine, (drafts, tokens, accepted, per_pos) in enumerate(
            [(100, 300, 150, [80, 50, 20]), (100, 300, 90, [60, 20, 10])]):
        metrics += [counter("drafts", drafts, engine), counter("draft_tokens", tokens, engine),
                    counter("accepted_tokens", accepted, engine),
                    Vector("vllm:spec_decode_num_accepted_tokens_per_pos", {}, per_pos)]
    stats = spec_decode_stats(metrics)
    assert (stats["drafts"], stats["draft_tokens"], stats["accepted_tokens"]) == (200, 600, 240)
    assert stats["acceptance_rate"] == 0.4 and stats["mean_acceptance_length"] == 2.2
    assert stats["per_position"] == [0.7, 0.35, 0.15]
    assert spec_decode_stats(metrics[:1]) is None


def test_pp_zero_from_the_command_line_exits_within_seconds_and_writes_nothing(tmp_path):
    out = tmp_path / "results"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.commands.cli", "bench", "--pp", "0", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "--pp 0 must be at least 1" in proc.stderr
    assert not out.exists()
    assert time.monotonic() - started < 30


#: vLLM's own lines of a PP=2 engine's log (vLLM 0.26, the 0.6B shape), among the plugin's.
ENGINE_LOG = """\
(Worker_PP0 pid=3034) INFO 11-23 08:41:40 [model_runner.py:86] PPCudaGraphModelRunner on pipeline stage 0 of 2 (first=True, last=False, breakable=False)
(Worker_PP0 pid=3034) WARNING 11-23 08:42:17 [jit_monitor.py:135] Triton kernel JIT compilation during inference: kernel_unified_attention. This causes a latency spike; consider extending warmup to cover this shape/config.
(Worker_PP0 pid=3034) WARNING 11-23 08:42:17 [jit_monitor.py:135] Triton kernel JIT compilation during inference: _post_update_kernel. This causes a latency spike; consider extending warmup to cover this shape/config.
(Worker_PP0 pid=3034) INFO 11-23 08:41:41 [cuda.py:483] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(Worker_PP1 pid=3035) INFO 11-23 08:41:41 [cuda.py:483] Using FLASH_ATTN attention backend out of potential backends: ['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(Worker_PP1 pid=3035) INFO 11-23 08:41:42 [cuda.py:300] Using TRITON Unquantized MoE backend out of potential backends: ['TRITON']
"""


def test_a_runs_log_tells_vllms_compiles_and_attention_backend_and_nothing_of_the_plugin():
    """The plugin's facts come from its records (``record_findings``): its log lines are
    for people and may change."""
    assert log_findings(ENGINE_LOG) == {
        "jit_compiles": ["kernel_unified_attention", "_post_update_kernel"],
        "attention_backend_used": "FLASH_ATTN",
    }
    assert log_findings("")["jit_compiles"] == []
    assert log_findings("")["attention_backend_used"] is None
    asked = "(Worker_PP0 pid=1) INFO [cuda.py:422] Using AttentionBackendEnum.TRITON_ATTN backend."
    assert log_findings(asked)["attention_backend_used"] == "TRITON_ATTN"


def test_a_run_without_records_ran_without_the_plugins_runner(tmp_path):
    from vllm_pp_cudagraph.commands.bench.engine_run import record_findings

    found = record_findings(tmp_path)
    assert found["plugin_stages"] == 0 and found["plan_records"] == 0
    assert found["cadence_choices"] == [] and found["layer_partition_used"] is None


def test_the_auto_split_runner_is_the_plugins_defaults_with_auto_layer_partition(monkeypatch):
    from vllm_pp_cudagraph.commands.bench.engine_run import RUNNERS, engine_env, runner_cadence
    from vllm_pp_cudagraph.shared.settings import LayerPartition, PPCudaGraphSettings

    settings = PPCudaGraphSettings.from_env(RUNNERS["plugin-auto-split"])
    assert settings.layer_partition is LayerPartition.AUTO
    assert settings.model_copy(update={"layer_partition": LayerPartition.VLLM}) == (
        PPCudaGraphSettings.from_env({}))
    assert runner_cadence("plugin-auto-split") == "auto"
    # neither this shell's plugin settings nor its split reach the engine: auto decides
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "vllm")
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "20,8")
    env = engine_env(RunSpec("plugin-auto-split", "full_and_piecewise", pp=3))
    assert env["VLLM_PP_CUDAGRAPH_LAYER_PARTITION"] == "auto"
    assert env["VLLM_PLUGINS"] == "pp_cudagraph" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "VLLM_PP_LAYER_PARTITION" not in env
    # a split asked for is set by hand, which wins over auto (and is logged as such)
    asked = engine_env(RunSpec("plugin-auto-split", "eager", layer_partition=[20, 8]))
    assert asked["VLLM_PP_LAYER_PARTITION"] == "20,8"


def test_the_console_names_the_split_a_run_chose_beside_vllms(capsys):
    args = argparse.Namespace(pp=3)
    chose = report("plugin-auto-split", "full_and_piecewise", layer_partition_used=[10, 10, 8])
    asked = {**report("plugin", "eager", layer_partition_used=[8, 10, 10]),
             "spec": {"runner": "plugin", "mode": "eager", "layer_partition": [8, 10, 10]}}
    print_findings(args, [chose, asked, report("stock", "eager")], [])
    assert capsys.readouterr().out.splitlines() == [
        "layer partition: plugin-auto-split:full_and_piecewise used 10,10,8 "
        "(vLLM's split: 9,10,9)"]


@pytest.mark.parametrize("flags, asked", [([], None), (["--attention-backend", "auto"], None),
                                          (["--attention-backend", "FLASHINFER"], "FLASHINFER")])
def test_the_attention_backend_is_vllms_choice_unless_one_is_named(flags, asked, tmp_path,
                                                                   monkeypatch):
    """Without --attention-backend no backend reaches vLLM, and bench.json says so."""
    from vllm_pp_cudagraph.commands.bench.engine_run import engine_kwargs
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

    _bench_with_engines_faked(monkeypatch, ["--weights", "dummy", "--modes", "stock:eager",
                                            "--out", str(tmp_path), *flags])
    spec = json.loads((tmp_path / "bench.json").read_text())["runs"][0]["spec"]
    assert spec["attention_backend"] == asked
    run = RunSpec(**spec)
    kwargs = engine_kwargs(run, "/m")
    assert kwargs.get("attention_backend", "none passed") == (asked or "none passed")
    cmd = serve_command(run, "/m", 8000)
    assert (cmd[cmd.index("--attention-backend") + 1] if asked else None) == asked
    assert ("--attention-backend" in cmd) == (asked is not None)


def _bench_with_engines_faked(monkeypatch, argv, plugin_digest="t1", plugin_stages=2,
                             gpus=2, tp_digest="t1", specs=None, cut_at=None) -> int:
    """``bench`` on ``gpus`` GPUs with each engine's run replaced by its report: stock gives
    tokens ``t1``, the plugin ``plugin_digest`` with its runner on ``plugin_stages``, the
    ``tp`` runner ``tp_digest``. Each RunSpec started is appended to ``specs``. The
    invocation is cut short (KeyboardInterrupt) as the ``cut_at``-th engine starts."""
    def engine(spec, log_path, timeout):
        if specs is not None:
            specs.append(spec)
        engine.started += 1
        if engine.started == cut_at:
            raise KeyboardInterrupt
        plugin = spec.runner == "plugin"
        digest = {"plugin": plugin_digest, "tp": tp_digest}.get(spec.runner, "t1")
        return {"spec": asdict(spec), "digest": digest, "run_digests": [digest],
                "req_per_s": 10.0, "plugin_stages": plugin_stages if plugin else 0,
                "returncode": 0}

    engine.started = 0
    monkeypatch.setattr(bench, "visible_gpus", lambda: gpus)
    monkeypatch.setattr(bench_runs, "run_in_subprocess", engine)
    return bench.main(argv)


@pytest.mark.parametrize("plugin_digest, exit_code", [("t1", 0), ("t2", 1)])
def test_a_batch_run_exits_non_zero_exactly_when_the_plugins_tokens_differ(
        plugin_digest, exit_code, tmp_path, monkeypatch, capsys):
    """The whole ``bench --workload batch`` command: the exit status is what a script
    checks for token agreement."""
    code = _bench_with_engines_faked(
        monkeypatch, ["--workload", "batch", "--weights", "dummy", "--out", str(tmp_path),
                      "--modes", "stock:eager,plugin:eager"], plugin_digest)
    console = capsys.readouterr().out
    assert code == exit_code, console
    assert (tmp_path / "bench.json").exists()
    assert ("TOKENS DIFFER: plugin:eager" in console) == (exit_code == 1)


def test_an_engine_run_reports_a_token_difference_but_fails_on_a_stage_without_the_plugin(
        tmp_path, monkeypatch, capsys):
    """Under arrivals vLLM is not batch-invariant: other tokens are reported, not
    fatal. A plugin run whose stages did not all log the plugin's runner is a stock
    run under the plugin's name, and fails the command."""
    argv = ["--workload", "engine", "--weights", "dummy", "--out", str(tmp_path),
            "--modes", "stock:eager,plugin:eager"]
    assert _bench_with_engines_faked(monkeypatch, argv, "t2") == 0, capsys.readouterr().out
    assert _bench_with_engines_faked(monkeypatch, argv, "t2", plugin_stages=1) == 1
    assert "PLUGIN NOT LOADED: plugin:eager logged the plugin's runner on 1 of 2" in (
        capsys.readouterr().out)


def test_a_serve_sweep_reports_one_row_per_runner_and_concurrency(tmp_path, monkeypatch, capsys):
    """``--workload serve``: each runner's server is driven at every concurrency, and
    every point lands in bench.json with the concurrency it ran at."""
    def sweep(spec, model, log_path, concurrencies, prompts, port, startup_timeout_s):
        return [{"spec": asdict(spec), "concurrency": c, "digest": "d", "req_per_s": c / 8,
                 "plugin_stages": 2 if spec.runner == "plugin" else 0,
                 "shutdown_clean": True} for c in concurrencies]

    monkeypatch.setattr(bench, "visible_gpus", lambda: 2)
    monkeypatch.setattr(bench_runs, "write_model_dir", lambda *a, **k: tmp_path / "model")
    monkeypatch.setattr(bench_runs, "run_vllm_bench_sweep", sweep)
    code = bench.main(["--workload", "serve", "--weights", "dummy", "--out", str(tmp_path),
                       "--concurrency", "64,256", "--modes", "stock:eager,plugin:eager"])
    assert code == 0, capsys.readouterr().out
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [(r["spec"]["runner"], r["concurrency"], r["returncode"]) for r in runs] == [
        ("stock", 64, 0), ("stock", 256, 0), ("plugin", 64, 0), ("plugin", 256, 0)]


def test_the_tp_runner_is_stock_vllm_by_tensor_parallelism_on_the_same_gpus(tmp_path,
                                                                          monkeypatch):
    """One invocation compares the plugin, stock and V1 at PP 2 with stock at TP 2: the
    ``tp`` engine gets tensor_parallel_size 2, no pipeline, no layer split, no plugin."""
    from vllm_pp_cudagraph.commands.bench.engine_run import engine_env, engine_kwargs

    specs = []
    code = _bench_with_engines_faked(
        monkeypatch, ["--workload", "engine", "--weights", "dummy", "--layer-partition", "14,14",
                      "--modes", "plugin:full_and_piecewise,stock:full_and_piecewise,"
                      "v1:full_and_piecewise,tp:full_and_piecewise", "--out", str(tmp_path)],
        specs=specs)
    assert code == 0
    layouts = {s.runner: (s.pp, s.tp, s.layer_partition) for s in specs}
    assert layouts == {"plugin": (2, 1, [14, 14]), "stock": (2, 1, [14, 14]),
                       "v1": (2, 1, [14, 14]), "tp": (1, 2, None)}
    tp = specs[-1]
    kwargs = engine_kwargs(tp, "/m")
    assert (kwargs["pipeline_parallel_size"], kwargs["tensor_parallel_size"]) == (1, 2)
    env = engine_env(tp)
    assert env["VLLM_PLUGINS"] == "" and env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "VLLM_PP_LAYER_PARTITION" not in env
    assert engine_env(specs[0])["VLLM_PLUGINS"] == "pp_cudagraph"
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [(r["spec"]["runner"], r["spec"]["pp"], r["spec"]["tp"]) for r in runs][-1] == (
        "tp", 1, 2)


def test_the_tp_runner_serves_with_tensor_parallelism_alone(tmp_path, monkeypatch):
    import vllm.platforms
    from _serve_parser import parse_serve_args

    from vllm_pp_cudagraph.commands.bench.engine_run import engine_env
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_command

    specs = []

    def sweep(spec, model, log_path, concurrencies, prompts, port, startup_timeout_s):
        specs.append(spec)
        return [{"spec": asdict(spec), "concurrency": 64, "digest": "n/a", "req_per_s": 8.0,
                 "shutdown_clean": True}]

    monkeypatch.setattr(bench, "visible_gpus", lambda: 2)
    monkeypatch.setattr(bench_runs, "write_model_dir", lambda *a, **k: tmp_path / "model")
    monkeypatch.setattr(bench_runs, "run_vllm_bench_sweep", sweep)
    monkeypatch.setattr(vllm.platforms.current_platform, "device_type", "cpu")  # for the parser
    assert bench.main(["--workload", "serve", "--weights", "dummy", "--out", str(tmp_path),
                       "--modes", "tp:full_and_piecewise"]) == 0
    served = parse_serve_args(serve_command(specs[0], "/m", 8000)[4:])
    assert (served.pipeline_parallel_size, served.tensor_parallel_size) == (1, 2)
    assert engine_env(specs[0])["VLLM_PLUGINS"] == ""


def test_a_tp_row_says_tp():
    tp = report("tp", "full_and_piecewise")
    tp["spec"].update(pp=1, tp=2)
    both = report("plugin", "full_and_piecewise")
    both["spec"].update(pp=2, tp=2)
    pipelined = report("plugin", "piecewise")
    pipelined["spec"].update(pp=2, tp=1)
    rows = render_table([tp, both, pipelined]).splitlines()[2:]
    assert rows[0].startswith("tp:full_and_piecewise [TP 2] ")
    assert rows[1].startswith("plugin:full_and_piecewise [PP 2 x TP 2] ")
    assert rows[2].startswith("plugin:piecewise ")


@pytest.mark.parametrize("tp_digest", ["t1", "t2"])
def test_tp_tokens_are_compared_but_another_layouts_difference_does_not_fail(
        tp_digest, tmp_path, monkeypatch, capsys):
    code = _bench_with_engines_faked(
        monkeypatch, ["--workload", "batch", "--weights", "dummy", "--out", str(tmp_path),
                      "--modes", "stock:eager,plugin:eager,tp:eager"], tp_digest=tp_digest)
    console = capsys.readouterr().out
    assert code == 0, console
    tp = json.loads((tmp_path / "bench.json").read_text())["runs"][-1]
    assert tp["tokens_agree"] is (tp_digest == "t1")
    assert tp["tokens_reference"] == "stock:eager" and tp["reference_layout_differs"]
    line = "TOKENS DIFFER: tp:eager vs stock:eager; its layout (PP 1 x TP 2) is not its reference's"
    assert (line in console) == (tp_digest == "t2")


def test_a_tp_engine_that_does_not_repeat_itself_still_fails():
    stock = report("stock", "eager", "e1", run_digests=["e1"])
    tp = report("tp", "eager", "e2", run_digests=["e3"])
    stock["spec"].update(pp=2, tp=1)
    tp["spec"].update(pp=1, tp=2)
    check_agreement([stock, tp])
    assert tp["tokens_agree"] is False and tp["reference_layout_differs"]
    assert not expected_difference(tp)
    assert "not a failure" not in disagreement_lines([stock, tp])[0]


def test_an_invocation_cut_short_leaves_every_finished_runs_numbers(tmp_path, monkeypatch):
    """bench.json is written as each run ends, so a run cut short mid-invocation still
    leaves the finished runs, judged, in a whole file."""
    argv = ["--workload", "batch", "--weights", "dummy", "--out", str(tmp_path),
            "--modes", "stock:eager,plugin:eager,v1:eager"]
    with pytest.raises(KeyboardInterrupt):
        _bench_with_engines_faked(monkeypatch, argv, plugin_digest="t2", cut_at=3)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["complete"] is False
    assert [(r["spec"]["runner"], r["req_per_s"], r["tokens_agree"]) for r in result["runs"]] == [
        ("stock", 10.0, True), ("plugin", 10.0, False)]
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]
    assert _bench_with_engines_faked(monkeypatch, argv, plugin_digest="t2") == 1
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["complete"] is True and len(result["runs"]) == 3


def test_at_pp1_a_plugin_run_without_the_plugins_runner_is_expected():
    """The plugin stands aside without a pipeline; at PP=2 the same run is flagged."""
    run = report("plugin", "eager", plugin_stages=0)
    assert plugin_not_loaded(argparse.Namespace(pp=1), [run]) == []
    assert plugin_not_loaded(argparse.Namespace(pp=2), [run]) == [run]


def test_help_lists_the_runners_users_pick_and_accepts_vllms_prompt_flag(capsys):
    """Runners for the project's own checks stay out of --help but still parse, and
    --num-prompts (vllm bench's name) is --prompts."""
    from vllm_pp_cudagraph.commands.bench.engine_run import INTERNAL_RUNNERS

    with pytest.raises(SystemExit):
        bench.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'plugin', 'plugin-auto-split'" in text.replace("\n", " ") or "plugin-auto-split" in text
    assert not [r for r in INTERNAL_RUNNERS if r in text]
    args = bench.build_parser().parse_args(["--modes", "plugin-unproven:eager",
                                            "--num-prompts", "7"])
    assert args.modes[0][0] == "plugin-unproven" and args.prompts == 7


def test_each_run_with_a_speed_carries_plans_prediction(tmp_path, monkeypatch, capsys):
    """bench.json keeps the prediction beside the measurement, and the console says the
    error, so every measured cell checks the model."""
    _bench_with_engines_faked(
        monkeypatch, ["--workload", "engine", "--model", "qwen3-32b", "--weights", "dummy",
                      "--modes", "plugin:full_and_piecewise,tp:full_and_piecewise",
                      "--prompts", "256", "--max-num-seqs", "256", "--input-len", "64",
                      "--output-len", "256", "--out", str(tmp_path)])
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    # The plugin's row as auto runs: vLLM's cadence, no other predicted 5% faster here.
    assert [r["predicted"]["cadence"] for r in runs] == ["vllm", None]
    assert all(r["predicted"]["req_per_s"] > 10 for r in runs)
    assert all(r["predicted"]["ttft_ms"] is None for r in runs)  # offline: no TTFT
    assert "plan predicted tp:full_and_piecewise [TP 2]" in capsys.readouterr().out


def test_each_run_records_the_other_processes_on_its_gpus(tmp_path, monkeypatch, capsys):
    """A process computing on the GPUs before or after a run is that run's neighbour: it
    lands in bench.json and the console calls the run not comparable."""
    # Before the first run, between the two, after the second.
    looks = iter([[], [], [{"pid": 4100, "used_mib": 1536}]])
    monkeypatch.setattr(bench_runs, "gpu_neighbours", lambda: next(looks))
    argv = ["--workload", "batch", "--weights", "dummy", "--out", str(tmp_path),
            "--modes", "stock:eager,plugin:eager"]
    assert _bench_with_engines_faked(monkeypatch, argv, "t1") == 0
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [r["gpu_neighbours"] for r in runs] == [[], [{"pid": 4100, "used_mib": 1536}]]
    console = capsys.readouterr().out
    assert "GPU SHARED: plugin:eager" in console and "GPU SHARED: stock:eager" not in console


def test_a_process_seen_only_before_a_run_is_its_neighbour(tmp_path, monkeypatch):
    """A job that held the GPUs as a run started and ended during it still shared them."""
    looks = iter([[{"pid": 4100, "used_mib": 1536}], [], []])
    monkeypatch.setattr(bench_runs, "gpu_neighbours", lambda: next(looks))
    argv = ["--workload", "batch", "--weights", "dummy", "--out", str(tmp_path),
            "--modes", "stock:eager,plugin:eager"]
    assert _bench_with_engines_faked(monkeypatch, argv, "t1") == 0
    runs = json.loads((tmp_path / "bench.json").read_text())["runs"]
    assert [r["gpu_neighbours"] for r in runs] == [[{"pid": 4100, "used_mib": 1536}], []]
