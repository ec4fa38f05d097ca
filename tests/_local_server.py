"""An aiohttp application served on a free loopback port, for the client tests.

:func:`completions_app` is a small OpenAI-compatible peer: it answers /health
and /v1/completions (JSON or server-sent events) with deterministic text, and
records which streams the client dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, LoadSpec, run_load


@asynccontextmanager
async def local_server(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1 while the block runs; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()


def completion_words(prompt: str, n: int, salt: str = "") -> list[str]:
    """The peer's answer to ``prompt``: ``n`` words; another ``salt``, other words."""
    base = sum(map(ord, prompt + salt))
    return [f"w{(base * 31 + i) % 151936}" for i in range(n)]


def word_ids(words: list[str]) -> list[int]:
    return [int(w[1:]) for w in words]


def completions_app(salt: str = "", fail_health_every: int = 0):
    """The peer and its state (health checks seen, streams the client dropped)."""
    state = {"health": 0, "dropped": 0}

    async def health(request):
        state["health"] += 1
        if fail_health_every and state["health"] % fail_health_every == 0:
            return web.Response(status=503)
        return web.Response(text="")

    async def completions(request):
        body = await request.json()
        words = completion_words(body["prompt"], body["max_tokens"], salt)
        prompt_ids = word_ids(body["prompt"].split())
        if not body.get("stream"):
            return web.json_response({"choices": [{
                "text": " ".join(words), "token_ids": word_ids(words),
                "prompt_token_ids": prompt_ids}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, w in enumerate(words):
                chunk = {"choices": [{"text": (" " if i else "") + w, "token_ids": word_ids([w]),
                                      "prompt_token_ids": None if i else prompt_ids}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(0.001)
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            state["dropped"] += 1
            raise
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    return app, state



async def serve_and_load(app: web.Application, **spec_overrides) -> tuple[LoadSpec, LoadReport]:
    """Serve ``app`` and send it 200 requests of 16 tokens, 32 at a time."""
    async with local_server(app) as base_url:
        spec = LoadSpec(
            base_url=base_url,
            model="m",
            prompts=[f"w{i} w{i + 1}" for i in range(20)],
            num_requests=200,
            concurrency=32,
            max_tokens=16,
            health_interval_s=0.05,
            **spec_overrides,
        )
        return spec, await run_load(spec)
