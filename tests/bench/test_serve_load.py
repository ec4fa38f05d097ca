"""The serving load client, against a small local OpenAI-compatible HTTP peer.

The peer answers /health and /v1/completions (JSON or server-sent events)
with deterministic text, and records which streams the client dropped.
"""

from __future__ import annotations

import asyncio

from _local_server import completion_words, completions_app, serve_and_load, word_ids

from vllm_pp_cudagraph.commands.bench.serve_load import LoadSpec, preemptions_from_metrics, request_body


def test_mixed_load_completes_streams_and_cancels_as_planned():
    app, state = completions_app()
    spec, report = asyncio.run(serve_and_load(app))
    summary = report.summary()
    assert summary["errors"] == 0
    planned_cancels = sum(spec.plan(i)[1] is not None for i in range(spec.num_requests))
    planned_streams = sum(spec.plan(i)[0] for i in range(spec.num_requests))
    assert 0 < planned_cancels < planned_streams < spec.num_requests
    assert summary["cancelled"] == planned_cancels
    assert summary["completed"] == spec.num_requests - planned_cancels
    assert summary["health_checks"] > 0 and summary["health_failures"] == 0
    for r in report.results:
        words = completion_words(spec.prompts[r.index % 20], 16)
        assert r.prompt_token_ids == word_ids(spec.prompts[r.index % 20].split())
        if r.cancelled:
            assert r.text == " ".join(words[: spec.max_tokens // 4])
        else:
            assert r.text == " ".join(words)
            assert r.token_ids == word_ids(words)
    assert summary["tpot_mean_ms"] > 0 and summary["ttft_mean_ms"] > 0
    assert state["dropped"] >= 1  # the server saw cancelled streams go away


def test_health_failures_are_counted():
    app, _ = completions_app(fail_health_every=2)
    _, report = asyncio.run(serve_and_load(app))
    assert report.summary()["health_failures"] >= 1


def test_plan_depends_only_on_seed_and_index():
    spec = LoadSpec("http://x", "m", ["p"], 100, 4, 32, seed=3)
    again = LoadSpec("http://y", "m2", ["q"], 100, 8, 32, seed=3)
    assert [spec.plan(i) for i in range(100)] == [again.plan(i) for i in range(100)]
    cancels = [spec.plan(i)[1] for i in range(100) if spec.plan(i)[1] is not None]
    assert cancels and all(c == 8 for c in cancels)


def test_preemptions_are_read_from_vllm_metrics():
    text = "\n".join([
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        'vllm:num_preemptions_total{engine="0",model_name="dummy"} 17.0',
        'vllm:num_preemptions_created{engine="0",model_name="dummy"} 1.7e9',
        'vllm:prompt_tokens_total{engine="0",model_name="dummy"} 4096.0',
    ])
    assert preemptions_from_metrics(text) == 17
    assert preemptions_from_metrics("vllm:prompt_tokens_total 1.0") is None


def test_a_sampling_mix_sends_each_requests_options_and_streams_one_choice():
    mix = {"greedy": {}, "hot": {"temperature": 0.9, "seed": 1}, "two": {"n": 2, "seed": 2}}
    spec = LoadSpec("http://x", "m", ["p"], 300, 4, 32, seed=1, sampling_mix=mix)
    plans = [spec.plan(i) for i in range(300)]
    assert {sampling for _, _, sampling in plans} == set(mix)
    assert not any(stream and sampling == "two" for stream, _, sampling in plans)
    for i, (stream, _, sampling) in enumerate(plans[:20]):
        body = request_body(spec, i, stream, sampling)
        assert {k: body[k] for k in mix[sampling]} == mix[sampling]
    plain = LoadSpec("http://x", "m", ["p"], 300, 4, 32, seed=1)
    assert {plan[2] for plan in map(plain.plan, range(300))} == {"greedy"}
    assert request_body(plain, 0, False, "greedy")["temperature"] == 0.0
