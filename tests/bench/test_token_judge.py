"""The batch workload's token judge: rounding at near ties passes, a fault does not."""

from __future__ import annotations

import argparse

import pytest
from vllm.logprobs import FlatLogprobs, Logprob
from vllm.outputs import CompletionOutput, RequestOutput

from vllm_pp_cudagraph.commands.bench.judging import exit_status, judge_tokens
from vllm_pp_cudagraph.commands.bench.report import disagreement_lines
from vllm_pp_cudagraph.commands.bench.token_judge import (
    NEAR_TIE_NATS,
    TokenRecord,
    divergences,
    first_divergence,
    judge,
    record_of,
)

#: Two requests of four greedy tokens; per position the top logprobs of one engine.
TOKENS = [[11, 12, 13, 14], [21, 22, 23, 24]]


def logprobs_for(tokens, runner_up_gap=1.0, ties=None):
    """Per position: the token at -0.5 and token+100 ``runner_up_gap`` nats below it;
    ``ties`` {(request, position): (other token, gap)} adds a near rival."""
    out = []
    for i, request in enumerate(tokens):
        positions = []
        for j, token in enumerate(request):
            position = {token: -0.5, token + 100: -0.5 - runner_up_gap}
            if ties and (i, j) in ties:
                other, gap = ties[(i, j)]
                position[other] = -0.5 - gap
            positions.append(position)
        out.append(positions)
    return out


def near_tie_pair(gap_a=0.03, gap_b=0.02):
    """Engine b parts from a at request 1, position 2, choosing 99 where a chose 23."""
    a = TokenRecord(TOKENS, logprobs_for(TOKENS, ties={(1, 2): (99, gap_a)}))
    b_tokens = [TOKENS[0], [21, 22, 99, 5]]
    b = TokenRecord(b_tokens, logprobs_for(b_tokens, ties={(1, 2): (23, gap_b)}))
    return a, b


def test_identical_tokens_are_identical():
    a = TokenRecord(TOKENS, logprobs_for(TOKENS))
    assert judge(a, a)["verdict"] == "identical"


def test_a_parting_at_a_near_tie_in_both_engines_is_rounding():
    verdict = judge(*near_tie_pair())
    assert verdict["verdict"] == "near-ties"
    assert (verdict["requests_differ"], verdict["beyond_near_tie"]) == (1, 0)
    assert verdict["largest_margin"] == pytest.approx(0.03)


def test_only_the_first_divergence_is_judged():
    # after parting, the contexts differ: b's later token 5 is nowhere in a's top choices
    (found,) = divergences(*near_tie_pair())
    assert (found.request, found.position, found.tokens) == (1, 2, (23, 99))


@pytest.mark.parametrize("gaps", [(0.2, 0.02), (0.02, 0.2)])
def test_a_token_far_below_either_engines_top_choice_is_a_difference(gaps):
    verdict = judge(*near_tie_pair(*gaps))
    assert verdict["verdict"] == "differ"
    assert verdict["first_beyond"][0]["request"] == 1
    assert verdict["first_beyond"][0]["position"] == 2


def test_the_bound_is_inclusive_and_can_be_set():
    a, b = near_tie_pair(0.1, 0.1)
    assert judge(a, b)["verdict"] == "near-ties"
    assert judge(a, b, bound=0.05)["verdict"] == "differ"


def test_another_requests_token_outside_the_recorded_choices_is_a_difference():
    a = TokenRecord(TOKENS, logprobs_for(TOKENS))
    swapped = [TOKENS[1], TOKENS[0]]
    verdict = judge(a, TokenRecord(swapped, logprobs_for(swapped)))
    assert verdict["verdict"] == "differ" and verdict["beyond_near_tie"] == 2
    assert verdict["first_beyond"][0]["margins"] == (None, None)


def test_a_lost_token_is_a_difference():
    # b skipped position 1 of request 0: at position 1 it gave a's next token
    a = TokenRecord(TOKENS, logprobs_for(TOKENS))
    lost = [[11, 13, 14, 15], TOKENS[1]]
    assert judge(a, TokenRecord(lost, logprobs_for(lost)))["verdict"] == "differ"


def test_a_request_that_stopped_early_is_a_difference():
    a = TokenRecord(TOKENS, logprobs_for(TOKENS))
    short = [TOKENS[0][:2], TOKENS[1]]
    assert first_divergence(TOKENS[0], short[0]) == 2
    assert judge(a, TokenRecord(short, logprobs_for(short)))["verdict"] == "differ"


def test_runs_of_other_batches_are_not_judged():
    a = TokenRecord(TOKENS, logprobs_for(TOKENS))
    with pytest.raises(ValueError, match="same batches"):
        judge(a, TokenRecord(TOKENS[:1], logprobs_for(TOKENS[:1])))


@pytest.mark.parametrize("container", [list, FlatLogprobs])
def test_a_record_is_read_from_vllms_outputs_and_round_trips(container, tmp_path):
    def completion(tokens, positions):
        logprobs = container()
        for position in positions:
            logprobs.append({k: Logprob(v, rank=1) for k, v in position.items()})
        return CompletionOutput(0, "", tokens, None, logprobs)

    expected = logprobs_for(TOKENS)
    outputs = [RequestOutput(str(i), None, [1], None, [completion(t, expected[i])], True)
               for i, t in enumerate(TOKENS)]
    record = record_of(outputs)
    assert record == TokenRecord(TOKENS, expected)
    record.save(tmp_path / "r.json")
    assert TokenRecord.load(tmp_path / "r.json") == record


def _run(tmp_path, name, runner, record, digest):
    path = tmp_path / f"{name}.tokens.json"
    record.save(path)
    return {"spec": {"runner": runner, "mode": "full_and_piecewise", "tokens_file": str(path)},
            "digest": digest, "request_digests": [digest[:1], digest[1:]]}


def _args():
    return argparse.Namespace(workload="batch", serve=False, near_tie_nats=NEAR_TIE_NATS)


def test_the_bench_passes_a_plugin_run_that_parts_from_stock_at_near_ties(tmp_path):
    a, b = near_tie_pair()
    stock = _run(tmp_path, "stock", "stock", a, "ab")
    control = _run(tmp_path, "stock2", "stock", a, "ab")
    plugin = _run(tmp_path, "plugin", "plugin-cadence", b, "ac")
    reports = [stock, plugin, control]
    judge_tokens(_args(), reports)
    assert plugin["tokens_agree"] is False and plugin["tokens_verdict"] == "near-ties"
    assert control["stock_control"] and control["tokens_verdict"] == "identical"
    assert exit_status(_args(), reports, []) == 0
    (line,) = disagreement_lines(reports)
    assert line.startswith("tokens differ at near ties only: plugin-cadence:full_and_piecewise")


def test_the_bench_fails_a_plugin_run_that_parts_from_stock_beyond_a_near_tie(tmp_path):
    a, b = near_tie_pair(gap_b=0.5)
    reports = [_run(tmp_path, "stock", "stock", a, "ab"),
               _run(tmp_path, "plugin", "plugin-cadence", b, "ac")]
    judge_tokens(_args(), reports)
    assert reports[1]["tokens_verdict"] == "differ"
    assert exit_status(_args(), reports, []) == 1
    (line,) = disagreement_lines(reports)
    assert line.startswith("TOKENS DIFFER: plugin-cadence:full_and_piecewise vs stock")
    assert "1 beyond a near tie of 0.1 nats" in line


def test_stock_differing_from_itself_beyond_a_near_tie_fails_as_an_undecided_check(tmp_path):
    a, b = near_tie_pair(gap_a=0.5)
    reports = [_run(tmp_path, "stock", "stock", a, "ab"),
               _run(tmp_path, "stock2", "stock", b, "ac")]
    judge_tokens(_args(), reports)
    assert reports[1]["stock_control"] and reports[1]["tokens_verdict"] == "differ"
    assert exit_status(_args(), reports, []) == 1
    (line,) = disagreement_lines(reports)
    assert "stock against itself" in line and "cannot decide" in line


def test_runs_without_recorded_logprobs_differ_when_their_digests_do(tmp_path):
    stock = {"spec": {"runner": "stock", "mode": "eager"}, "digest": "ab"}
    plugin = {"spec": {"runner": "plugin", "mode": "eager"}, "digest": "ac"}
    judge_tokens(_args(), [stock, plugin])
    assert plugin["tokens_verdict"] == "differ" and "divergence" not in plugin
