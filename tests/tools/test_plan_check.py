"""benchmarks/tools/plan_check.py: each measured run predicted, the error and the winners."""

from __future__ import annotations

import json

from benchmarks.tools import plan_check
from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES
from vllm_pp_cudagraph.commands.planning.plan import predict_run


def run(runner: str, req_per_s: float, **extra) -> dict:
    return {"folder": "cell", "workload": "engine", "shape": "qwen3-32b", "runner": runner,
            "pp": 1 if runner == "tp" else 2, "tp": 2 if runner == "tp" else 1,
            "prompts": 256, "input_len": 64, "output_len": 256, "max_num_seqs": 256,
            "concurrency": None, "req_per_s": req_per_s, **extra}


def predict(run: dict):
    return predict_run(SHAPES[run["shape"]], run)


def test_each_run_gets_its_prediction_and_error():
    rows = plan_check.rows([run("stock", 30.0), run("plugin", 40.0, cadence="auto")])
    stock = rows[0]
    assert stock["error"] == stock["predicted"] / 30.0 - 1
    assert rows[1]["predicted_cadence"] in ("vllm", "balance", "merge")


def test_a_wrong_winner_is_named_and_v1_is_left_out_of_the_winners(tmp_path, capsys):
    # The 32B shape's measured cost table puts TP=2 ahead of the plugin's PP=2 here.
    runs = [run("plugin", 60.0), run("tp", 30.0), run("v1", 99.0)]
    table = plan_check.rows(runs)
    assert plan_check.winners(table) == {"cell 256 x 64/256": ("plugin", "tp")}
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(runs))
    assert plan_check.main([str(cells)]) == 0
    out = capsys.readouterr().out
    assert "is the measured fastest in 0 of 1 cells" in out


def _predicted(runner: str, predicted: float, measured: float) -> dict:
    return {**run(runner, measured), "predicted": predicted, "error": predicted / measured - 1,
            "tpot_error": None, "host_paced": False}


def test_plans_rule_says_too_close_within_the_error_and_names_a_wrong_recommendation():
    """plan recommends only where the model puts the best layout beyond its own median
    error of the next; a recommendation the measured cell contradicts is named."""
    close = [_predicted("plugin", 40.0, 30.0), _predicted("tp", 37.0, 45.0)]
    assert plan_check.decisions(close, error=0.10)["cell 256 x 64/256"]["verdict"] == "too close"
    clear = [_predicted("plugin", 40.0, 30.0), _predicted("tp", 30.0, 45.0)]
    assert plan_check.decisions(clear, error=0.10)["cell 256 x 64/256"] == {
        "verdict": "wrong", "recommended": "plugin", "measured": "tp"}
    right = [_predicted("plugin", 40.0, 50.0), _predicted("tp", 30.0, 45.0)]
    assert plan_check.decisions(right, error=0.10)["cell 256 x 64/256"]["verdict"] == "right"
    # Measured level (13.64 against 13.65): the recommendation is not contradicted.
    level = [_predicted("plugin", 14.2, 13.64), _predicted("stock", 11.7, 13.65)]
    assert plan_check.decisions(level, error=0.10)["cell 256 x 64/256"]["verdict"] == "right"


def test_a_runner_measured_twice_in_a_cell_counts_once_at_its_mean():
    runs = [_predicted("stock", 30.0, 38.0), _predicted("stock", 30.0, 40.0),
            _predicted("plugin", 40.0, 39.5)]
    # Stock at 38 and 40 is 39 on the mean, below the plugin's 39.5 (not 40, its best run).
    assert plan_check.winners(runs)["cell 256 x 64/256"] == ("plugin", "plugin")


def test_a_run_is_predicted_on_its_own_gpu_and_release():
    """An H100 run is predicted slower than the same run on an H200 (less bandwidth), and
    stock PP on vLLM 0.33 under serve is calibrated level with the plugin's steps."""
    serve = {**run("stock", 30.0), "workload": "serve", "concurrency": 256,
             "vllm_version": "0.33.0"}
    h100 = predict({**serve, "gpu": "NVIDIA H100 80GB HBM3"})
    h200 = predict({**serve, "gpu": "NVIDIA H200"})
    assert h100.req_per_s < h200.req_per_s
    old = predict({**serve, "gpu": "NVIDIA H200", "vllm_version": "0.26.0"})
    assert old.req_per_s < h200.req_per_s


def test_errors_by_layout_kind_and_workload_leave_v1_out():
    table = [{**_predicted("plugin", 44.0, 40.0)}, {**_predicted("plugin-merge", 36.0, 40.0)},
             {**_predicted("v1", 10.0, 40.0)}, {**_predicted("tp", 42.0, 40.0)}]
    assert plan_check.errors_by_kind(table) == {"plugin": {"engine": 0.1}, "tp": {"engine": 0.05}}


def test_the_plugin_on_vllms_cadence_is_predicted_as_the_plugins_runner():
    """``plugin-cadence`` runs vLLM's cadence on the plugin's runner: its steps cost the
    plugin's, not stock's (1.31x on vLLM 0.26)."""
    on_026 = {"vllm_version": "0.26.0", "gpu": "NVIDIA H200"}
    cadence = predict({**run("plugin-cadence", 1.0), **on_026})
    balance = predict({**run("plugin-balance", 1.0), **on_026})
    stock = predict({**run("stock", 1.0), **on_026})
    assert cadence.req_per_s == balance.req_per_s > stock.req_per_s


def test_a_served_runs_ttft_is_checked_where_the_model_predicts_it():
    served = {"workload": "serve", "prompts": 2048, "concurrency": 1024, "max_num_seqs": 1024,
              "ttft_p50_ms": 2500.0}
    [row] = plan_check.rows([run("stock", 40.0, **served)])
    assert row["ttft_error"] == row["predicted_ttft_ms"] / 2500.0 - 1
    [offline] = plan_check.rows([run("stock", 30.0, ttft_p50_ms=2500.0)])
    assert offline["predicted_ttft_ms"] is None and offline["ttft_error"] is None


def test_rows_the_host_paces_are_flagged_and_their_errors_pooled_apart():
    """The launch-bound 0.6B shape served at concurrency 64 is host-paced in the model, the
    32B shape at 1,024 is not; each pace's rows get their own median error, so a served
    0.6B row does not borrow the 32B rows' few percent."""
    served = {"workload": "serve", "prompts": None, "vllm_version": "0.33.0",
              "gpu": "NVIDIA H200"}
    small = {**run("plugin", 60.0), **served, "shape": "qwen3-0.6b", "concurrency": 64,
             "max_num_seqs": 1024, "api_servers": 4}
    big = {**run("plugin", 40.0), **served, "concurrency": 1024, "max_num_seqs": 1024}
    assert [r["host_paced"] for r in plan_check.rows([small, big])] == [True, False]
    table = [{**_predicted("plugin", 42.0, 40.0), "workload": "serve"},
             {**_predicted("plugin", 84.0, 60.0), "workload": "serve", "host_paced": True}]
    assert plan_check.errors_by_kind(table) == {
        "plugin": {"serve": 0.05, "serve, host-paced": 0.4}}


def test_one_runner_at_two_layouts_in_a_cell_is_two_contenders():
    """On four GPUs the plugin ran at PP=4 and at TP=2 x PP=2: each is judged on its own,
    not averaged into one "plugin" that no layout measured."""
    pp4 = {**_predicted("plugin", 41.7, 35.1), "pp": 4, "tp": 1}
    tp2pp2 = {**_predicted("plugin", 54.6, 50.9), "pp": 2, "tp": 2}
    stock = {**_predicted("stock", 41.7, 32.0), "pp": 4, "tp": 1}
    assert plan_check.winners([pp4, tp2pp2, stock])["cell 256 x 64/256"] == (
        "plugin TP=2 x PP=2", "plugin TP=2 x PP=2")
    # TP=2 x PP=2 alone ahead of PP=4 beyond the error: recommended, and measured fastest.
    decided = plan_check.decisions([pp4, tp2pp2, stock], error=0.10)["cell 256 x 64/256"]
    assert decided == {"verdict": "right", "recommended": "plugin TP=2 x PP=2",
                       "measured": "plugin TP=2 x PP=2"}
