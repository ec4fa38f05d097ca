"""Pairing two lanes that served side by side: each slot's ratio, and per pair of runners
the median over both lane orders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tools.lanes_report import markdown, ratios, slots


def run(runner: str, req_per_s: float, concurrency: int = 1024) -> dict:
    return {"spec": {"runner": runner}, "input_len": 64, "concurrency": concurrency,
            "req_per_s": req_per_s, "pass_req_per_s": [req_per_s - 0.5, req_per_s + 0.5],
            "tpot_p50_ms": 90.0, "ttft_p50_ms": 2000.0, "plugin_stages": 2,
            "pass_stage_step_ms": [[42.0, 41.5], [43.0, 42.5]],
            "engine_metrics": {"cadence": "vllm", "cadence_trials_total": 4,
                               "cadence_trial_steps_total": 20,
                               "cadence_switches_total": 0, "group_sizes": [512, 512],
                               "recent_trials": [trial("balance", "held"),
                                                 trial("merge", "lost widely"),
                                                 trial("balance", "held")]},
            "stage_metrics": {"0": {"busy_fraction": 0.99, "step_ms": 40.0,
                                    "graph_steps_total": 96, "eager_steps_total": 4}}}


def trial(cadence: str, outcome: str) -> dict:
    return {"step": 100, "cadence": cadence, "ms_per_token": 80.0, "against_ms": 70.0,
            "decoding": 1024, "outcome": outcome}


def write_lane(directory: Path, lane: str, runs: list[dict]) -> None:
    (directory / f"lane-{lane}").mkdir(parents=True)
    (directory / f"lane-{lane}" / "bench.json").write_text(json.dumps({"runs": runs}))


def test_each_runner_is_compared_with_the_one_beside_it_in_both_lane_orders(tmp_path):
    write_lane(tmp_path, "a", [run("plugin", 36.0), run("stock", 40.0), run("plugin", 10.0, 64)])
    write_lane(tmp_path, "b", [run("stock", 40.0), run("plugin", 38.0)])
    paired = slots(tmp_path)
    assert [(s["slot"], s["a"]["runner"], s["b"]["runner"]) for s in paired] == [
        (1, "plugin", "stock"), (2, "stock", "plugin")]
    [pair] = ratios(paired)
    assert (pair["runner"], pair["over"]) == ("plugin", "stock")
    assert pair["ratios"] == [0.9, 0.95]
    assert pair["median"] == pytest.approx(0.925)
    # Pass by pass: 35.5/39.5, 36.5/40.5 in slot 1; stock over plugin inverted in slot 2.
    assert pair["pass_ratios"] == [round(35.5 / 39.5, 3), round(36.5 / 40.5, 3),
                                   round(37.5 / 39.5, 3), round(38.5 / 40.5, 3)]
    assert pair["pass_median"] == pytest.approx((36.5 / 40.5 + 37.5 / 39.5) / 2, abs=1e-3)
    assert paired[0]["a"]["graph_share"] == 0.96
    table = markdown(paired, [pair])
    assert "| 1 | 64 in x c1024 | plugin (vllm) | 35.50, 36.50 |" in table
    # What auto did on each server: why it kept vLLM's cadence, from its trials' verdicts.
    assert ("| 1 | a | plugin | 42.0/41.5, 43.0/42.5 | vllm | 0 | 4 (20) | balance held 2, "
            "merge lost widely 1 |") in table


def test_open_loop_runs_pair_only_at_the_same_rate_and_compare_their_latencies(tmp_path):
    """Under arrivals at a rate both servers serve the same req/s: what tells them apart
    is each pass pair's TPOT and TTFT."""
    def at(runner, rate, tpot, ttft):
        served = run(runner, 30.0)
        served.update(spec={"runner": runner, "request_rate": rate},
                      pass_tpot_p50_ms=[tpot, tpot + 2], pass_ttft_p50_ms=[ttft, ttft])
        return served

    write_lane(tmp_path, "a", [at("plugin", 34.0, 30.0, 50.0), at("stock", 20.0, 25.0, 40.0)])
    write_lane(tmp_path, "b", [at("stock", 34.0, 40.0, 50.0), at("plugin", 34.0, 30.0, 45.0)])
    paired = slots(tmp_path)
    assert [s["slot"] for s in paired] == [1]  # slot 2's rates differ: not the same load
    [pair] = ratios(paired)
    assert pair["request_rate"] == 34.0
    assert pair["tpot_ratios"] == [0.75, round(32 / 42, 3)]
    assert pair["tpot_median"] == pytest.approx((0.75 + 32 / 42) / 2, abs=1e-3)
    assert pair["ttft_median"] == 1.0
    table = markdown(paired, [pair])
    assert "| 1 | 64 in at 34/s (c1024 at most) | plugin (vllm) |" in table
    assert f"| {pair['pass_median']:.3f} | {pair['tpot_median']:.3f} | 1.000 |" in table
