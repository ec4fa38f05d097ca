"""The storm of aborted and bad requests judges a server by what it answered."""

from __future__ import annotations

import asyncio
import json

from _local_server import local_server
from aiohttp import web

from benchmarks.tools.serve_storm import BAD_REQUESTS, after_storm, problems, storm


def storm_app(bad_status: dict[str, int] | None = None, left_running: int = 0,
              stream_status: int = 200):
    """A peer that turns bad requests away with 400 (or ``bad_status`` by a field it
    recognises), streams good ones, and reports ``left_running`` requests at /metrics."""
    bad_status = bad_status or {}

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "malformed"}, status=400)
        if body.get("model") != "dummy":
            return web.json_response({"error": "no such model"}, status=404)
        for field, status in bad_status.items():
            if field in body:
                return web.json_response({"error": field}, status=status)
        wrong = (len(body["prompt"].split()) > 512 or body["max_tokens"] < 0
                 or body.get("temperature", 0) < 0 or body.get("top_p", 1) > 1
                 or body.get("n", 1) < 1 or body.get("logprobs", 0) > 20)
        if wrong:
            return web.json_response({"error": "bad request"}, status=400)
        if body.get("stream") and stream_status != 200:
            return web.json_response({"error": "engine dead"}, status=stream_status)
        if not body.get("stream"):
            await asyncio.sleep(0.01)
            return web.json_response({"choices": [{"text": "w1 w2"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(body["max_tokens"]):
                await resp.write(f'data: {{"choices": [{{"text": "w{i}"}}]}}\n\n'.encode())
                await asyncio.sleep(0.002)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=f'vllm:num_requests_running{{engine="0"}} {left_running}\n'
                                 'vllm:num_requests_waiting{engine="0"} 0\n')

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def run_storm(app: web.Application) -> dict:
    async def run() -> dict:
        async with local_server(app) as base_url:
            tally = await storm(base_url, "dummy", seconds=1.5, streams=8)
            return {**tally.report(), **await after_storm(base_url, "dummy", settle_s=0)}
    return asyncio.run(run())


def test_a_server_that_turns_every_bad_request_away_and_drops_nothing_passes():
    report = run_storm(storm_app())
    assert problems(report) == []
    assert set(report["bad"]) == set(BAD_REQUESTS)
    assert all(codes and set(codes) <= {"400", "404"} for codes in report["bad"].values())
    assert set(report["bad"]["unknown model"]) == {"404"}
    assert {"complete", "stop_after_first_chunk", "client_timeout"} <= set(report["good"])
    assert report["good_failed"] == 0
    assert report["requests_left"] == 0 and report["serves_after"] and report["healthy_after"]


def test_a_5xx_for_a_bad_request_and_requests_left_behind_are_named():
    report = run_storm(storm_app(bad_status={"n": 500}, left_running=3))
    found = problems(report)
    assert any(p.startswith("n of zero: answered {'500'") for p in found), found
    assert "after the storm requests_left = 3, not 0" in found


def test_good_requests_that_fail_though_the_client_kept_them_are_named():
    report = run_storm(storm_app(stream_status=500))
    found = problems(report)
    assert report["good_failed"] > 0
    assert any("good requests failed: stop_after_first_chunk: HTTP 500" in p
               or "good requests failed: client_timeout: HTTP 500" in p for p in found), found
