"""``vllm-pp-cudagraph plan``: the layouts it predicts, what it recommends, what it refuses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.commands.cli import command as cli
from vllm_pp_cudagraph.commands.planning.measured import MeasuredCell
from vllm_pp_cudagraph.commands.planning.pipeline_model import Prediction, Workload
from vllm_pp_cudagraph.commands.planning.plan import Row, recommendation

#: A GPU as torch describes it, for the commands that read the visible ones.
GPU = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30)

H200 = ["--gpu-memory-gib", "141"]


def run_plan(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["plan", *argv])
    return code, capsys.readouterr().out


def test_two_gpus_compare_plugin_pp_stock_pp_and_tp(clean_env, capsys):
    code, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", *H200)
    assert code == cli.EXIT_OK
    rows = {line.split("  ")[0].strip() for line in out.splitlines()}
    assert {"plugin PP=2", "stock PP=2", "stock TP=2"} <= rows
    assert "recommended: " in out
    assert "rests on: the cost table qwen3-h5120-l64-a64kv8d128-i25600-v151936-b2.json " \
           "(measured); TP=2's shard on the cost table " \
           "qwen3-h5120-l64-a32kv4d128-i12800-v75968-b2.json (measured on H100 SXM" in out


def test_four_gpus_add_tp_times_pp(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "llama-3.1-70b", "--gpus", "4", *H200)
    assert "plugin TP=2 x PP=2" in out and "stock TP=4" in out


def test_a_model_too_big_for_the_gpus_is_said_not_to_fit(clean_env, capsys):
    code, out = run_plan(capsys, "--model", "llama-3.1-70b", "--gpus", "2",
                         "--gpu-memory-gib", "40")
    assert code == cli.EXIT_FAILED
    assert out.count("does not fit") == 3
    assert "recommended: none (no layout fits: more GPUs, GPUs with more memory" in out
    # TP has no stages: its row speaks of the weights' shard on each GPU.
    [tp_row] = [line for line in out.splitlines() if line.startswith("stock TP=2 ")]
    assert "does not fit: the weights (" in tp_row and "per GPU, a 1/2 shard)" in tp_row
    [pp_row] = [line for line in out.splitlines() if line.startswith("plugin PP=2 ")]
    assert "does not fit: stage 0's weights (" in pp_row


def test_a_layout_the_heads_do_not_divide_into_is_named(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "3", *H200)
    line = next(line for line in out.splitlines() if line.startswith("stock TP=3"))
    assert line.endswith("not possible: the model's 16 attention and 8 KV heads do not "
                         "divide by 3")


def test_an_unknown_model_is_named_before_any_gpu_is_looked_for(clean_env, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "--model", "no-such-model", "--gpus", "2"])
    assert exit_.value.code == cli.EXIT_MISCONFIGURED
    assert "--model no-such-model: no readable config.json" in capsys.readouterr().err


def test_without_a_visible_gpu_or_gpu_flag_plan_assumes_the_gpu_its_help_names(
        clean_env, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_visible_gpus", lambda: [])
    monkeypatch.setattr(cli, "_gpu_memory_bytes", lambda: None)
    cli.main(["plan", "--model", "qwen3-0.6b", "--gpus", "2"])
    out = capsys.readouterr().out
    assert "(141 GiB x 0.92)" in out and "GPU: H200 (assumed: --gpu names yours" in out


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "1"], "a plan compares layouts of at least 2 GPUs"),
    (["--gpus", "40"], "the model has 28 decoder layers, fewer than the stages of PP=40"),
    (["--gpus", "2", "--concurrency", "0"], "--concurrency must be at least 1"),
    (["--gpus", "2", "--api-server-count", "0"], "--api-server-count must be at least 1"),
    (["--gpus", "2", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["--gpus", "2", "--prompts", "0"], "--prompts must be at least 1"),
    # Not "no GPU is visible": the memory was given, wrongly.
    (["--gpus", "2", "--gpu-memory-gib", "-5"], "--gpu-memory-gib must be positive"),
])
def test_bad_layouts_are_refused_naming_the_flag(clean_env, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "--model", "qwen3-0.6b", *H200, *argv])
    assert exit_.value.code == cli.EXIT_MISCONFIGURED
    assert message in capsys.readouterr().err


def test_plan_and_check_agree_on_the_layer_split(clean_env, capsys):
    clean_env.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    clean_env.setattr(cli, "_visible_gpus", lambda: [GPU] * 1)
    shape = ["--model", "qwen3-0.6b", "--max-num-seqs", "128", *H200]
    _, planned = run_plan(capsys, *shape, "--gpus", "3")
    cli.main(["check", *shape, "--pp", "3"])
    checked = capsys.readouterr().out
    assert "auto picks 10,10,8 for PP=3" in planned
    assert "auto picks 10,10,8 for PP=3" in checked


def bench_commands_in(out: str) -> list[list[str]]:
    return [line.split()[2:] for line in out.splitlines()
            if line.startswith("  vllm-pp-cudagraph bench ")]


def test_a_measured_cell_is_printed_and_its_winner_recommended(clean_env, capsys):
    """The 32B offline cell on two GPUs was measured (TP=2 won by 15%, passes within 4%):
    plan prints it beside the prediction and recommends what was measured."""
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--prompts", "256",
                      "--max-num-seqs", "256", *H200)
    assert "measured on 2x H200, vLLM 0.33.0, engine: plugin PP=2 37.72, stock PP=2 32.41, " \
           "stock TP=2 43.44 req/s; stock TP=2 won" in out
    assert "recommended: stock TP=2 (measured on 2x H200)" in out


def test_a_measured_winner_overrides_the_prediction_and_says_so():
    def row(layout, pp, tp, req_per_s):
        return Row(Prediction(layout, pp, tp, 0.02, req_per_s, req_per_s * 256, (1.0,)),
                   kv_tokens=10**6, fits=True)

    rows = [row("plugin PP=2", 2, 1, 45.0), row("stock PP=2", 2, 1, 40.0),
            row("stock TP=2", 1, 2, 41.0)]
    cell = MeasuredCell("qwen3-32b", 2, "nvlink", "engine", 256, 64, 256, 256, "2x H200",
                        "0.33.0", {"plugin PP=2": 37.8, "stock PP=2": 33.0, "stock TP=2": 43.5},
                        "stock TP=2", "two passes", "results/x")
    work = Workload(concurrency=256, input_len=64, output_len=256, prompts=256)
    assert recommendation(rows, work, "qwen3-32b", [cell]) == [
        "recommended: stock TP=2 (measured on 2x H200; the model predicted plugin PP=2)"]


def test_a_measured_winner_does_not_settle_a_layout_its_cell_did_not_measure(
        clean_env, capsys):
    """The seed's burst on two H200s: the plugin beat stock PP=2, but TP=2 was not served
    and is predicted well ahead, so the cell's winner is not the recommendation; the bench
    command measures the winner against TP."""
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "128",
                      "--max-num-seqs", "1024", "--input-len", "2", "--output-len", "512",
                      "--gpu", "h200")
    assert "plugin PP=2 10.90, stock PP=2 10.62 req/s; plugin PP=2 won" in out
    assert ("recommended: too close to call (plugin PP=2 won against stock PP=2 on 2x H200; "
            "stock TP=2, not measured at this load, is predicted at") in out
    [command] = bench_commands_in(out)
    assert command[-1] == "plugin:full_and_piecewise,tp:full_and_piecewise"


def test_of_two_cells_that_answer_the_question_the_one_with_more_layouts_decides(
        clean_env, capsys):
    """The 4B shape served at concurrency 64 was measured twice on 2x H200: the plugin
    beside stock PP=2 (the plugin won), then TP=2, the plugin and stock one after another
    (TP=2 won). Both are printed; the cell that also measured TP settles the question."""
    _, out = run_plan(capsys, "--model", "qwen3-4b", "--gpus", "2", "--concurrency", "64",
                      "--max-num-seqs", "1024", "--api-server-count", "4", "--gpu", "h200")
    assert "plugin PP=2 47.52, stock PP=2 31.13 req/s; plugin PP=2 won" in out
    assert "stock TP=2 59.03, plugin PP=2 49.23, stock PP=2 37.32 req/s; stock TP=2 won" in out
    assert "recommended: stock TP=2 (measured on 2x H200" in out


def test_a_served_prediction_is_held_to_what_its_api_servers_put_out(clean_env, capsys):
    """The 0.6B shape served at concurrency 1,024 put out at most 17.8k tokens/s through one
    API server, bound by it and the client; the GPUs alone would give 3x that. Plan holds
    each served row to that bound, marks it and says how to lift it; offline batches, and
    rows below the bound (the 32B shape), are as the model predicts them."""
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "2", "--concurrency", "1024",
                      "--max-num-seqs", "1024", "--gpu", "h200")
    rows = [line for line in out.splitlines() if line.startswith(("plugin PP=", "stock TP=",
                                                                   "stock PP="))]
    assert [row.split()[5] for row in rows] == ["17782"] * 3, rows
    assert all(row.endswith("(held by the API servers)") for row in rows)
    assert ("plugin PP=2, stock PP=2, stock TP=2: held to the 17,782 output tokens/s 1 API "
            "server put out") in out
    assert "plan --api-server-count" in out
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "2", "--prompts", "1024",
                      "--max-num-seqs", "1024", "--gpu", "h200")
    assert "API server" not in out
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "1024",
                      "--max-num-seqs", "1024", "--gpu", "h200")
    assert "API server" not in out


def test_more_api_servers_are_their_own_question(clean_env, capsys):
    """With four API servers no committed cell was bound by them: the rows are the GPUs'
    prediction, the cell served with four is the one printed beside them, and the bench
    command that would decide serves with four too."""
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "2", "--concurrency", "1024",
                      "--max-num-seqs", "1024", "--gpu", "h200", "--api-server-count", "4")
    assert "held" not in out
    assert "--api-server-count 4, two servers side by side" in out
    assert "mean of four passes each; pass pairs 0.93" not in out  # the one-server cell
    commands = bench_commands_in(out)
    assert commands and all(" ".join(c).count("--api-server-count 4") == 1 for c in commands)


def test_a_served_run_is_predicted_with_its_api_servers():
    """The plan check judges a served run as plan would predict it: held to its API
    servers' measured bound, by the count the run served with."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
    from vllm_pp_cudagraph.commands.planning.plan import predict_run

    run = {**_served_run("stock", vllm_version="0.33.0", gpu="NVIDIA H200"),
           "input_len": 64, "output_len": 256, "max_num_seqs": 1024, "concurrency": 1024}
    one = predict_run(SHAPES["qwen3-0.6b"], run)
    four = predict_run(SHAPES["qwen3-0.6b"], {**run, "api_servers": 4})
    assert one.api_ceiling == pytest.approx(one.output_tok_per_s)
    assert four.api_ceiling is None and four.req_per_s > 2 * one.req_per_s
    # Held by one API server, the split of its queue into TTFT and TPOT is not modelled.
    assert one.ttft_s is None and four.ttft_s > 0


@pytest.fixture
def on_vllm_033(monkeypatch):
    """Stock PP calibrated as on vLLM 0.33, whichever release runs the tests."""
    from vllm_pp_cudagraph.shared import vllm_surface

    monkeypatch.setattr(vllm_surface, "installed_versions",
                        lambda: vllm_surface.VersionInfo(vllm="0.33.0", torch=None))


def test_layouts_predicted_within_the_models_error_are_too_close_to_call(
        clean_env, capsys, on_vllm_033):
    """No cell was measured at this load and the best layouts are predicted closer than
    the model's median error: plan says so and gives the bench command that decides,
    one the bench accepts as it is."""
    from vllm_pp_cudagraph.commands.bench.argument_checks import argument_problems
    from vllm_pp_cudagraph.commands.bench.cli import build_parser

    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "256",
                      "--max-num-seqs", "256", *H200)
    [line] = [line for line in out.splitlines() if line.startswith("recommended: ")]
    assert line.startswith("recommended: too close to call (") and "are predicted within" in line
    assert all(layout in line for layout in ("plugin PP=2", "stock PP=2", "stock TP=2"))
    # The one it would pick, and by how much, are said even so.
    fastest = max(("plugin PP=2", "stock PP=2", "stock TP=2"),
                  key=lambda layout: float(next(row for row in out.splitlines()
                                                if row.startswith(layout)).split()[3]))
    assert f"the model favours {fastest}, by " in line
    [command] = bench_commands_in(out)
    args = build_parser().parse_args(command)
    assert argument_problems(args) == []
    assert (args.pp, args.tp, args.workload, args.points) == (2, 1, "serve", [(64, 256)])
    assert {runner for runner, *_ in args.modes} == {"plugin", "stock", "tp"}


def test_cells_measured_level_leave_the_choice_open_and_name_what_was_not_measured(
        clean_env, capsys):
    """At concurrency 1,024 the plugin and stock PP=2 were measured level, TP=2 not at
    all: the prediction (the plugin 26% ahead of stock PP) is not the recommendation."""
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "1024",
                      "--max-num-seqs", "1024", *H200)
    assert out.count("\nmeasured on ") == 6  # 2x H200 four times, and 2x H100 twice
    assert ("recommended: too close to call (plugin PP=2 and stock PP=2 measured level on "
            "2x H100; stock TP=2 not measured at this load; the model favours ") in out
    assert "recommended: plugin PP=2" not in out
    [command] = bench_commands_in(out)
    assert command[-1] == "plugin:full_and_piecewise,tp:full_and_piecewise"


def test_a_layout_predicted_beyond_the_errors_of_those_measured_level_is_recommended(
        monkeypatch):
    """PP=2 measured level with stock PP=2, TP=2 not measured: TP=2 predicted ahead by
    more than both rows' errors is the recommendation; within them, too close to call;
    behind by more, the measured pair is what is left to decide."""
    from vllm_pp_cudagraph.commands.planning import plan

    monkeypatch.setattr(plan, "row_error", lambda kind, workload, host_paced: 0.10)

    def rows(tp_req_per_s):
        return [Row(Prediction(layout, pp, tp, 0.02, value, value * 256, (1.0,)),
                    kv_tokens=10**6, fits=True)
                for layout, pp, tp, value in (("plugin PP=2", 2, 1, 28.7),
                                              ("stock PP=2", 2, 1, 28.7),
                                              ("stock TP=2", 1, 2, tp_req_per_s))]

    cell = MeasuredCell("qwen3-32b", 2, "nvlink", "serve", 256, 64, 256, 1024, "2x H100",
                        "0.33.0", {"plugin PP=2": 27.6, "stock PP=2": 27.9}, None,
                        "two passes", "results/x")
    work = Workload(concurrency=256, input_len=64, output_len=256, max_num_seqs=1024)
    [line] = recommendation(rows(34.8), work, "qwen3-32b", [cell])
    assert line.startswith("recommended: stock TP=2 (predicted 21% faster than plugin PP=2, "
                           "beyond both rows' errors; stock TP=2 not measured at this load")
    line, command = recommendation(rows(31.0), work, "qwen3-32b", [cell])
    assert line.startswith("recommended: too close to call (plugin PP=2 and stock PP=2 "
                           "measured level on 2x H100; stock TP=2 not measured")
    assert command.endswith("--modes plugin:full_and_piecewise,tp:full_and_piecewise")
    # TP=2 predicted behind beyond both errors: the choice is between the two measured.
    line, command = recommendation(rows(20.0), work, "qwen3-32b", [cell])
    assert "stock TP=2 predicted 30% slower, beyond both rows' errors" in line
    assert command.endswith("--modes plugin:full_and_piecewise,stock:full_and_piecewise")


def test_a_clear_prediction_is_recommended_as_it_is(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "qwen3-30b-a3b", "--gpus", "2", "--concurrency", "256",
                      *H200)
    assert "recommended: stock TP=2\n" in out and "measured on 2x" not in out


def test_tp_times_pp_and_tp_alone_are_measured_in_one_bench_invocation():
    from vllm_pp_cudagraph.commands.planning.pipeline_model import Prediction, Workload
    from vllm_pp_cudagraph.commands.planning.plan import bench_commands

    layouts = [Prediction("plugin TP=2 x PP=2", 2, 2, 0.02, 10.0, 1.0, ()),
               Prediction("stock TP=4", 1, 4, 0.02, 9.0, 1.0, ())]
    [command] = bench_commands("m", Workload(8, 64, 256, 256, prompts=256), layouts)
    assert "--pp 2 --tp 2" in command and "--workload engine --prompts 256" in command
    assert command.endswith("--modes plugin:full_and_piecewise,tp:full_and_piecewise")
    layouts[1] = Prediction("stock PP=4", 4, 1, 0.02, 9.0, 1.0, ())
    assert len(bench_commands("m", Workload(8, 64, 256), layouts)) == 2


def test_the_gpu_named_sets_its_memory_and_rates(clean_env, capsys):
    """An H100 reads memory at 0.7x an H200's bandwidth and computes as fast: the PP rows,
    whose steps mostly read weights, slow down by at most that ratio (the prompts computed
    in the steps do not), and its 80 GiB is the memory where none is given."""
    def req_per_s(out: str, layout: str) -> float:
        line = next(line for line in out.splitlines() if line.startswith(layout))
        return float(line.split()[3])

    load = ["--model", "qwen3-32b", "--gpus", "2", "--concurrency", "256"]
    _, h200 = run_plan(capsys, *load, "--gpu", "h200")
    _, h100 = run_plan(capsys, *load, "--gpu", "h100")
    assert "GPU: H100 SXM (--gpu; 3.35 TB/s, 989 TFLOPS BF16" in h100
    assert "on 2 GPUs (80 GiB x 0.92)" in h100 and "on 2 GPUs (141 GiB x 0.92)" in h200
    ratio = req_per_s(h100, "plugin PP=2") / req_per_s(h200, "plugin PP=2")
    assert 3.35 / 4.8 - 0.01 < ratio < 0.95
    _, small = run_plan(capsys, *load, "--gpu", "h100", "--gpu-memory-gib", "60")
    assert "on 2 GPUs (60 GiB x 0.92)" in small


def test_without_gpu_the_visible_gpu_sets_the_rates_and_memory(clean_env, capsys):
    h100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30)
    clean_env.setattr(cli, "_visible_gpus", lambda: [h100, h100])
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2")
    assert "GPU: H100 SXM (the visible NVIDIA H100 80GB HBM3;" in out
    assert "on 2 GPUs (80 GiB x 0.92)" in out
    clean_env.setattr(cli, "_visible_gpus", lambda: [SimpleNamespace(name="Some GPU",
                                                                     total_memory=2**35)])
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2")
    assert "the visible Some GPU is not one plan knows; --gpu names one" in out
    assert "on 2 GPUs (32 GiB x 0.92)" in out


def test_a_cost_table_from_another_gpu_is_scaled_and_says_so(clean_env, capsys):
    """The 0.6B table was measured on an H100: for an H200 it is converted part by part,
    and the output says so; for an H100 it is used as measured."""
    load = ["--model", "qwen3-0.6b", "--gpus", "2", "--concurrency", "256"]
    _, h200 = run_plan(capsys, *load, "--gpu", "h200")
    _, h100 = run_plan(capsys, *load, "--gpu", "h100")
    assert "(measured on H100 SXM, converted to H200: by bandwidth what reads memory" in h200
    assert "(measured)" in h100 and "converted" not in h100.split("rests on")[1].split(";")[0]


def test_without_a_gpu_named_or_visible_plan_says_it_assumes_an_h200(clean_env, capsys):
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", *H200)
    assert "GPU: H200 (assumed: --gpu names yours;" in out


@pytest.mark.parametrize("installed, workload, release, factor", [
    ("0.33.0", "serve", "0.33", 1.0), ("0.33.0", "engine", "0.33", 1.16),
    ("0.34.1", "serve", "0.33", 1.0), ("0.26.0", "serve", "0.26", 1.31),
    ("0.29.0", "engine", "0.26", 1.31), ("0.20.0", "engine", "0.26", 1.31)])
def test_stock_pp_is_calibrated_on_the_installed_release(installed, workload, release, factor):
    """Stock's cost per PP step comes from the cells of the newest measured release at or
    below the installed one (vLLM 0.33 staggers decodes itself: level with the plugin when
    served), its engine figure where that release has no serve cells."""
    from vllm_pp_cudagraph.commands.planning.measured import stock_calibration

    found = stock_calibration(installed, workload)
    assert (found.vllm, found.factor) == (release, factor)
    assert found.source.rsplit("/", 1)[-1][:4] == "2026"  # a dated results folder


def _served_run(runner: str, **spec) -> dict:
    return {"runner": runner, "workload": "serve", "pp": 2, "tp": 1, "prompts": 128,
            "input_len": 64, "output_len": 256, "max_num_seqs": 1024, "concurrency": 1024,
            "interconnect": "nvlink", **spec}


def test_a_bench_run_is_predicted_on_its_own_release_and_gpu():
    """The prediction ``bench`` prints beside a run and the one the plan check judges are
    one: stock calibrated for the run's release, the rates of the run's GPU."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
    from vllm_pp_cudagraph.commands.planning.plan import predict_run

    def req_per_s(runner: str, **spec) -> float:
        return predict_run(SHAPES["qwen3-32b"], _served_run(runner, **spec)).req_per_s

    on_033 = {"vllm_version": "0.33.0", "gpu": "NVIDIA H200"}
    assert req_per_s("stock", **on_033) == pytest.approx(req_per_s("plugin-cadence", **on_033))
    on_026 = {"vllm_version": "0.26.0", "gpu": "NVIDIA H200"}
    assert req_per_s("stock", **on_026) < 0.9 * req_per_s("plugin-cadence", **on_026)
    on_h100 = {"vllm_version": "0.33.0", "gpu": "NVIDIA H100 80GB HBM3"}
    assert req_per_s("plugin-cadence", **on_h100) < req_per_s("plugin-cadence", **on_033)


def test_plan_says_which_release_stock_is_calibrated_on(clean_env, capsys, on_vllm_033):
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "1024",
                      "--max-num-seqs", "1024", *H200)
    assert "stock PP: 1.00x the plugin's GPU time per step, as measured on vLLM 0.33 (serve" in out
    rows = {line.split()[0]: line.split()[3] for line in out.splitlines()
            if line.startswith(("plugin PP=2", "stock PP=2"))}
    assert len(rows) == 2 and len(set(rows.values())) == 1


def test_plan_and_bench_take_the_same_interconnect_names(clean_env, capsys):
    """A user copies ``--interconnect`` from ``plan`` to the ``bench`` command it prints:
    every name one takes, the other takes, and plan refuses another naming them all."""
    from vllm_pp_cudagraph.commands.bench.interconnect import INTERCONNECTS

    for name in INTERCONNECTS:
        code, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", *H200,
                             "--interconnect", name)
        assert code == cli.EXIT_OK and f", {name};" in out
    with pytest.raises(SystemExit):
        cli.main(["plan", "--model", "qwen3-32b", "--gpus", "2", *H200,
                  "--interconnect", "pcie"])
    err = capsys.readouterr().err
    assert all(name in err for name in INTERCONNECTS), err


def test_slower_links_cost_pp_and_tp_what_the_link_bench_measured():
    """Each link's hand-off and all-reduce follow links.json: a narrower link makes both
    dearer, TP's many all-reduces most (the order users see in plan's table)."""
    import json
    from importlib.resources import files

    from vllm_pp_cudagraph.commands.planning.pipeline_model import IN_GRAPH_ALL_REDUCE_LATENCY_S, LINKS

    table = json.loads(files("vllm_pp_cudagraph.commands.planning").joinpath("links.json").read_text())
    for name, ops in table["links"].items():
        moved = 64 << 20  # bytes: where bandwidth, not latency, decides
        assert LINKS[name].transfer_s(moved) == pytest.approx(
            ops["send_recv"]["latency_s"] + moved / ops["send_recv"]["bytes_per_s"])
        assert LINKS[name].all_reduce_s(moved, 2) == pytest.approx(
            IN_GRAPH_ALL_REDUCE_LATENCY_S[name] + moved / ops["all_reduce"]["bytes_per_s"])
    sizes = [LINKS[n].all_reduce_s(1 << 20, 2) for n in ("nvlink", "host", "socket")]
    assert sizes == sorted(sizes)


def test_each_row_carries_the_models_error_for_layouts_and_loads_like_it(clean_env, capsys):
    """Served, the plugin's rows were further off than TP's offline: each row says its
    own, from the measured cells, and a layout no cell measured gets the overall median."""
    from vllm_pp_cudagraph.commands.planning.measured import median_error, row_error

    assert row_error("plugin", "serve") != row_error("tp", "engine")
    assert row_error("tp", "serve") == median_error()  # no served TP cell yet
    _, out = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency", "256",
                      "--max-num-seqs", "256", *H200)
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert f"±{row_error('plugin', 'serve'):.0%}" in rows["plugin PP=2"]
    assert f"±{median_error():.0%}" in rows["stock TP=2"]
    assert "off by: the model's median error on req/s" in out


def test_a_host_paced_row_carries_the_error_of_host_paced_rows(clean_env, capsys):
    """The 0.6B shape served at concurrency 64 is paced by the host, where the model was
    off by more: its rows say so, not the error of GPU-paced served rows."""
    from vllm_pp_cudagraph.commands.planning.measured import row_error

    assert row_error("plugin", "serve", host_paced=True) > row_error("plugin", "serve")
    _, out = run_plan(capsys, "--model", "qwen3-0.6b", "--gpus", "2", "--concurrency", "64",
                      "--max-num-seqs", "1024", "--api-server-count", "4", *H200)
    rows = {line.split("  ")[0]: line for line in out.splitlines()}
    assert f"±{row_error('plugin', 'serve', host_paced=True):.0%}" in rows["plugin PP=2"]
    assert f"±{row_error('stock', 'serve', host_paced=True):.0%}" in rows["stock PP=2"]
    assert f"±{row_error('tp', 'serve', host_paced=True):.0%}" in rows["stock TP=2"]


def test_a_host_paced_row_of_a_kind_never_measured_so_takes_the_largest_such_error(
        monkeypatch):
    """Host time is one term for every layout: a kind with no host-paced rows measured
    takes the largest host-paced error of the kinds that have them, not the median."""
    from vllm_pp_cudagraph.commands.planning import measured

    table = {"median_error": 0.15, "errors": {
        "plugin": {"serve": 0.07, "serve, host-paced": 0.28},
        "stock": {"serve": 0.04, "serve, host-paced": 0.09}, "tp": {"engine": 0.1}}}
    monkeypatch.setattr(measured, "_table", lambda: table)
    assert measured.row_error("tp", "serve", host_paced=True) == 0.28
    assert measured.row_error("tp", "serve") == 0.15


def test_two_layouts_are_too_close_within_the_larger_of_their_errors(monkeypatch):
    """A pair of layouts is too close to call where their predictions differ by less than
    the larger of the two kinds' errors, not the overall median."""
    from vllm_pp_cudagraph.commands.planning import plan
    from vllm_pp_cudagraph.commands.planning.pipeline_model import Prediction

    errors = {"plugin": 0.25, "tp": 0.05, "stock": 0.05}
    monkeypatch.setattr(plan, "row_error", lambda kind, workload, host_paced: errors[kind])

    tp = Prediction("stock TP=2", 1, 2, 0.02, 40.0, 1000.0, ())
    plugin = Prediction("plugin PP=2", 2, 1, 0.02, 34.0, 1000.0, ())  # 18% apart
    assert [p.layout for p in plan._predicted_close([tp, plugin], "serve")[1]] == [
        "stock TP=2", "plugin PP=2"]
    errors["plugin"] = 0.10
    assert [p.layout for p in plan._predicted_close([tp, plugin], "serve")[1]] == [
        "stock TP=2"]


def test_served_rows_carry_ttft_and_offline_rows_do_not(clean_env, capsys):
    _, served = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--concurrency",
                         "256", *H200)
    header, row = [line for line in served.splitlines()
                   if line.startswith(("layout ", "plugin PP=2 "))]
    assert "TTFT s" in header and float(row.split()[7]) > 0
    _, offline = run_plan(capsys, "--model", "qwen3-32b", "--gpus", "2", "--prompts", "256",
                          *H200)
    assert "TTFT" not in offline
