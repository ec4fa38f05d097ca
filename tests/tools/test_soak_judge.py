"""How the soak judges outputs: shares of differing requests, the token check, the sampling mix.

Runs against small local peers: the OpenAI-compatible completions peer of
``_local_server`` and a scoring peer whose model's top choice is known.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from _local_server import completions_app, local_server, serve_and_load
from aiohttp import web

from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, LoadSpec, RequestResult, request_body

from benchmarks.tools.sampling_mix import SAMPLING_MIX, SCHEMA, STRUCTURED_MIX, scored, structured
from benchmarks.tools.soak_judge import (
    GreedyCheck,
    completed_sequences,
    differing_share,
    divergence_word,
    greedy_margins,
    greedy_verdict,
    score_greedy,
    soak_verdict,
    structured_problems,
)


def test_same_server_twice_differs_nowhere_and_another_differs_everywhere():
    _, a = asyncio.run(serve_and_load(completions_app()[0]))
    _, b = asyncio.run(serve_and_load(completions_app()[0]))
    _, c = asyncio.run(serve_and_load(completions_app(salt="x")[0]))
    assert differing_share(a, b) == 0.0
    assert differing_share(a, c) == pytest.approx(1.0)


def _report(texts: list[str]) -> LoadReport:
    return LoadReport([RequestResult(i, False, text=t) for i, t in enumerate(texts)], 1.0, 0, [])


def test_divergence_word_tells_late_noise_from_an_early_wrong_token():
    base = _report(["a b c d e f", "a b c d e f", "x y z w"])
    late = _report(["a b c d e Q", "a b c d Q f", "x y z w"])
    early = _report(["Q b c d e f", "a Q c d e f", "x y z w"])
    assert differing_share(base, late) == differing_share(base, early) == pytest.approx(2 / 3)
    assert divergence_word(base, late) == 4.5
    assert divergence_word(base, early) == 0.5
    assert math.isnan(divergence_word(base, base))


def served(errors=0, health_failures=0, clean=True):
    return {"load": {"errors": errors, "health_failures": health_failures},
            "shutdown_clean": clean, "shutdown_rc": 0 if clean else None}


def test_soak_passes_when_plugin_differs_no_more_than_stock_from_itself():
    assert soak_verdict(served(), 0.02, 0.03) == []
    assert soak_verdict(served(), 0.03, 0.03) == []
    [problem] = soak_verdict(served(), 0.05, 0.03)
    assert "5.0% of requests differ from stock" in problem and "3.0%" in problem


def test_a_plugin_on_another_cadence_is_not_held_to_stocks_share_but_still_served_cleanly():
    assert soak_verdict(served(), 0.74, 0.43, shares_judge=False) == []
    [problem] = soak_verdict(served(errors=1), 0.74, 0.43, shares_judge=False)
    assert "1 request errors" in problem


def test_soak_names_every_serving_failure():
    problems = soak_verdict(served(errors=3, health_failures=1, clean=False), 0.0, 0.0)
    assert len(problems) == 3
    assert "3 request errors" in problems[0] and "1 failed health checks" in problems[1]
    assert "unclean shutdown" in problems[2]
    assert soak_verdict({"error": "server exited with rc=1"}, 0.0, 0.0) == ["server exited with rc=1"]
    assert "no request completed" in soak_verdict(served(), float("nan"), 0.0)[0]


# A scoring peer for the token check: its model's first choice after token t is
# next_token(t), at log-probability -0.1; any other token scores GAP lower.
GAP = 3.0


def next_token(t: int) -> int:
    return (t * 31 + 7) % 1000


def make_scoring_app():
    seen = []

    async def completions(request):
        body = await request.json()
        assert body["prompt_logprobs"] == 1 and body["max_tokens"] == 1
        ids = body["prompt"]
        seen.append(ids)
        logprobs = [None]
        for prev, tok in zip(ids, ids[1:]):
            top = next_token(prev)
            entry = {str(top): {"logprob": -0.1, "rank": 1, "decoded_token": "x"}}
            if tok != top:
                entry[str(tok)] = {"logprob": -0.1 - GAP, "rank": 7, "decoded_token": "y"}
            logprobs.append(entry)
        return web.json_response({"choices": [{"text": "", "prompt_logprobs": logprobs}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app, seen


def greedy_run(prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(next_token(ids[-1]))
    return ids


async def score_on_peer(sequences):
    app, seen = make_scoring_app()
    async with local_server(app) as base_url:
        return await score_greedy(base_url, "m", sequences, concurrency=4), seen


def test_token_check_finds_a_repeated_token_and_nothing_in_greedy_outputs():
    clean = {i: (greedy_run([i, i + 1], 20), 2) for i in range(8)}
    check, seen = asyncio.run(score_on_peer(clean))
    assert (check.requests, check.positions, check.not_first_choice, check.max_margin) == (8, 160, 0, 0.0)
    assert sorted(map(tuple, seen)) == sorted(tuple(ids) for ids, _ in clean.values())

    broken = dict(clean)
    ids = greedy_run([3, 4], 10)
    # token 5 of the output repeated, as a lost placeholder would serve it
    broken[3] = (ids[:2 + 5] + [ids[2 + 4]] + greedy_run([ids[2 + 4]], 9)[1:], 2)
    check, _ = asyncio.run(score_on_peer(broken))
    assert check.not_first_choice == 1
    assert check.max_margin == pytest.approx(GAP)
    assert check.worst[0][:2] == (3, 5)


def test_token_check_scores_only_the_output_part():
    # The prompt itself is not greedy under the peer's model; only outputs count.
    check, _ = asyncio.run(score_on_peer({0: ([5, 900, 17] + greedy_run([17], 4)[1:], 3)}))
    assert (check.positions, check.not_first_choice) == (4, 0)


def test_greedy_margins_read_vllm_prompt_logprobs():
    payload = [None, {"12": {"logprob": -0.5}}, {"40": {"logprob": -1.25}, "41": {"logprob": -1.0}}]
    assert greedy_margins(payload, [3, 12, 40], 1) == [0.0, pytest.approx(0.25)]


def test_completed_sequences_skip_cancelled_and_failed_requests():
    report = LoadReport([
        RequestResult(0, False, text="a", prompt_token_ids=[1, 2], token_ids=[3]),
        RequestResult(1, True, cancelled=True, prompt_token_ids=[1], token_ids=[4]),
        RequestResult(2, False, error="HTTP 500"),
        RequestResult(3, True, text="b", prompt_token_ids=[9], token_ids=[8, 7]),
    ], 1.0, 0, [])
    assert completed_sequences(report) == {0: ([1, 2, 3], 2), 3: ([9, 8, 7], 1)}


def check(max_margin: float, errors=()) -> GreedyCheck:
    return GreedyCheck(10, 100, int(max_margin > 0), max_margin,
                       [(4, 17, max_margin)] if max_margin else [], list(errors))


def test_token_verdict_allows_the_rounding_stock_itself_shows():
    assert greedy_verdict(check(0.03), check(0.02)) == []
    assert greedy_verdict(check(0.0), check(0.0)) == []
    [problem] = greedy_verdict(check(2.5), check(0.02))
    assert "2.500 nats below the top choice" in problem and "(4, 17)" in problem and "0.020" in problem
    [problem] = greedy_verdict(check(0.0), check(0.0, errors=["request 3: HTTP 400: bad"]))
    assert "stock: 1+ scoring errors" in problem and "HTTP 400" in problem


@pytest.mark.parametrize("sampling", sorted(SAMPLING_MIX))
def test_each_sampling_option_reaches_vllms_sampling_params(sampling):
    """What the soak sends parses with vLLM's own request model, and each option
    arrives in the SamplingParams the engine will sample with."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    spec = LoadSpec("http://x", "m", ["w5 w6"], 10, 2, 32, sampling_mix=SAMPLING_MIX)
    body = request_body(spec, 0, stream=False, sampling=sampling)
    params = CompletionRequest(**body).to_sampling_params(max_tokens=32)
    expected = {"temperature": 0.0, "ignore_eos": True, **SAMPLING_MIX[sampling]}
    for key, value in expected.items():
        assert getattr(params, key) == value, key
    assert scored(sampling) == (params.temperature == 0.0 and params.n == 1
                                and params.presence_penalty == 0.0
                                and params.frequency_penalty == 0.0
                                and params.repetition_penalty == 1.0
                                and params.min_tokens == 0)


def test_sampling_mix_covers_every_option_and_streams_one_choice():
    spec = LoadSpec("http://x", "m", ["p"], 600, 4, 32, seed=1, sampling_mix=SAMPLING_MIX)
    plans = [spec.plan(i) for i in range(600)]
    assert {sampling for _, _, sampling in plans} == set(SAMPLING_MIX)
    assert not any(stream and SAMPLING_MIX[s].get("n", 1) > 1 for stream, _, s in plans)
    plain = LoadSpec("http://x", "m", ["p"], 600, 4, 32, seed=1)
    assert {plan[2] for plan in map(plain.plan, range(600))} == {"greedy"}
    assert [p[:2] for p in plans] == [plain.plan(i)[:2] for i in range(600)]


def test_the_token_check_scores_only_outputs_that_follow_the_top_choice():
    results = [RequestResult(i, False, sampling=s, prompt_token_ids=[1], token_ids=[2, 3])
               for i, s in enumerate(SAMPLING_MIX)]
    kept = completed_sequences(LoadReport(results, 1.0, 0, []))
    assert {results[i].sampling for i in kept} == {"greedy", "logprobs", "stop"}


@pytest.mark.parametrize("sampling", sorted(STRUCTURED_MIX))
def test_each_structured_option_reaches_vllm_as_a_json_schema_ended_by_eos(sampling):
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    spec = LoadSpec("http://x", "m", ["w5 w6"], 10, 2, 32,
                    sampling_mix=SAMPLING_MIX | STRUCTURED_MIX)
    body = request_body(spec, 0, stream=True, sampling=sampling)
    params = CompletionRequest(**body).to_sampling_params(max_tokens=32)
    assert params.structured_outputs.json == SCHEMA
    assert params.ignore_eos is False  # the grammar's end must end the request
    assert structured(sampling) and not scored(sampling)


def test_structured_options_make_about_a_quarter_of_the_load():
    spec = LoadSpec("http://x", "m", ["p"], 2000, 4, 32, seed=3,
                    sampling_mix=SAMPLING_MIX | STRUCTURED_MIX)
    plans = [spec.plan(i) for i in range(2000)]
    share = sum(structured(s) for _, _, s in plans) / len(plans)
    assert 0.22 < share < 0.33, share
    assert {s for _, _, s in plans} == set(SAMPLING_MIX) | set(STRUCTURED_MIX)
    assert any(stream and structured(s) for stream, _, s in plans)


def test_every_completed_structured_output_must_parse_and_match():
    good = '{"colour":"red","size":"M","ok":true}'
    results = [
        RequestResult(0, False, sampling="json-schema", text=good),
        RequestResult(1, True, sampling="json-schema-seeded", text='{"colour":"red","si'),
        RequestResult(2, True, sampling="json-schema", text='{"col', cancelled=True),
        RequestResult(3, False, sampling="json-schema-penalties", text='{"colour":"pink",'
                      '"size":"M","ok":true}'),
        RequestResult(4, False, sampling="greedy", text="w5 w6"),
        RequestResult(5, False, sampling="json-schema", error="HTTP 500: boom"),
    ]
    problems = structured_problems(LoadReport(results, 1.0, 0, []))
    assert len(problems) == 2
    assert problems[0].startswith("request 1 (json-schema-seeded): does not parse")
    assert problems[1].startswith("request 3 (json-schema-penalties): does not match")


def test_structured_soak_needs_the_sampling_mix(tmp_path, capsys):
    from benchmarks.tools.soak import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(tmp_path / "soak"), "--structured"])
    assert exit_info.value.code == 2
    assert "give --sampling-mix too" in capsys.readouterr().err
    assert not (tmp_path / "soak").exists()
