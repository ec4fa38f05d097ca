"""benchmarks/tools/plan_check.py: each measured run predicted, the error and the winners."""

from __future__ import annotations

import json

from benchmarks.tools import plan_check


def run(runner: str, req_per_s: float, **extra) -> dict:
    return {"folder": "cell", "workload": "engine", "shape": "qwen3-32b", "runner": runner,
            "pp": 1 if runner == "tp" else 2, "tp": 2 if runner == "tp" else 1,
            "prompts": 256, "input_len": 64, "output_len": 256, "max_num_seqs": 256,
            "concurrency": None, "req_per_s": req_per_s, **extra}


def test_each_run_gets_its_prediction_and_error():
    rows = plan_check.rows([run("stock", 30.0), run("plugin", 40.0, cadence="auto")])
    stock = rows[0]
    assert stock["error"] == stock["predicted"] / 30.0 - 1
    assert rows[1]["predicted_cadence"] in ("balance", "merge")


def test_a_wrong_winner_is_named_and_v1_is_left_out_of_the_winners(tmp_path, capsys):
    runs = [run("plugin", 30.0), run("tp", 60.0), run("v1", 99.0)]
    table = plan_check.rows(runs)
    assert plan_check.winners(table) == {"cell 256 x 64/256": ("tp", "plugin")}
    cells = tmp_path / "cells.json"
    cells.write_text(json.dumps(runs))
    assert plan_check.main([str(cells)]) == 0
    assert "right in 0 of 1 cells; cell 256 x 64/256: measured tp, predicted plugin" in \
        capsys.readouterr().out
