"""Pooling serving soaks: runs of one configuration are judged together across soaks."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.tools.soak_judge import share_differing
from benchmarks.tools.soak_pool import judge, main


def _soak(path, digests: dict, preemption: bool = False):
    result = {"requests": 2000, "max_tokens": 128, "mode": "eager", "plugin_runner": "plugin",
              "stock_mode": "eager",
              "preemption": preemption, "batch_invariant": False, "request_digests": digests}
    refusal = {"case": "bad-plugin-setting", "passed": True}
    path.write_text(json.dumps([result, refusal]))
    return path


def test_share_counts_only_requests_completed_in_both_runs():
    assert share_differing(["a", "b", None, "d"], ["a", "x", "c", None]) == 0.5
    assert math.isnan(share_differing([None], ["a"]))


def test_runs_of_two_soaks_are_pooled_and_judged_by_the_soaks_rule(tmp_path, capsys):
    # The first soak alone: the plugin differs from both stock runs in 1 of 4
    # requests, stock from itself in none: fails. Pooled with the second, stock's
    # runs of different soaks differ in 2 of 4 (mean over six pairs 1/3), and the
    # plugin's mean over its eight pairs is 5/16: passes.
    first = _soak(tmp_path / "a.json", {"plugin": ["a", "b", "c", "x"],
                                        "stock_a": list("abcd"), "stock_b": list("abcd")})
    second = _soak(tmp_path / "b.json", {"plugin": ["a", "b", "y", "z"],
                                         "stock_a": list("abyz"), "stock_b": list("abyz")})
    assert main([str(first)]) == 1
    assert main([str(first), str(second)]) == 0
    verdict = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (verdict["plugin_runs"], verdict["stock_runs"]) == (2, 4)
    assert verdict["pairs"] == {"plugin_vs_stock": 8, "stock_vs_stock": 6}
    assert verdict["plugin_vs_stock"] == pytest.approx(5 / 16)
    assert verdict["stock_vs_stock"] == pytest.approx(1 / 3)
    # Cast as the plugin, the two stock runs of one soak differ from the other
    # soak's in every pair and fail; the four castings mixing soaks pass.
    assert verdict["stock_cast_as_plugin"] == {"castings": 6, "failing": 2}


def test_configurations_are_not_mixed(tmp_path, capsys):
    plain = _soak(tmp_path / "a.json", {"plugin": list("ab"), "stock_a": list("ab"),
                                        "stock_b": list("ab")})
    preempted = _soak(tmp_path / "b.json", {"plugin": list("xy"), "stock_a": list("ab"),
                                            "stock_b": list("ab")}, preemption=True)
    assert main([str(plain), str(preempted)]) == 1
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(v["preemption"], v["passed"]) for v in verdicts] == [("False", True), ("True", False)]


def test_stock_cast_as_plugin_shows_how_often_the_rule_fails_stock_itself():
    # One plugin run, so each stock run in turn takes its part against the other
    # two. Only the odd one out fails: it differs from both in 1 of 4 requests,
    # the other two from each other in none.
    runs = {"plugin": list("abcd"), "stock_a": list("abcd"), "stock_b": list("abcd"),
            "stock_c": list("abcx")}
    verdict = judge(runs)
    assert verdict["passed"]
    assert verdict["stock_cast_as_plugin"] == {"castings": 3, "failing": 1}
    # With two stock runs there is nothing to cast.
    del runs["stock_c"]
    assert judge(runs)["stock_cast_as_plugin"] is None


def test_too_few_runs_cannot_pass():
    assert judge({"plugin": list("ab"), "stock_a": list("ab")}) == {
        "plugin_runs": 1, "stock_runs": 1, "passed": False,
        "problem": "needs a plugin run and two stock runs with requests in common"}


def test_soaks_without_digests_are_refused_with_the_reason(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{"mode": "eager", "plugin_vs_stock": 0.6}]))
    with pytest.raises(SystemExit):
        main([str(old)])
    assert "no soak result holds request digests" in capsys.readouterr().err
