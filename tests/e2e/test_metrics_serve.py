"""The per-stage metrics behind ``vllm serve -pp 2``: under traffic from ``vllm bench
serve``, /metrics has every series for every stage, in range, and the log has the
pipeline line."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("two_gpus")]

STAGE_SERIES = ("stage_busy_ratio", "stage_wait_ratio", "stage_step_seconds", "stage_layers",
                "stage_reporting", "stage_graph_steps_total", "stage_eager_steps_total",
                "stage_handoff_bytes_total")
SAMPLE = re.compile(r'^vllm_pp_cudagraph:(\w+)\{([^}]*)\} (\S+)$', re.M)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The plugin's samples in a Prometheus exposition: (name, labels, value)."""
    return [(name, dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value))
            for name, labels, value in SAMPLE.findall(text)]


async def scrape_under_load(base_url: str, model_dir: str, out: Path) -> dict:
    """Run ``vllm bench serve`` and scrape /metrics every 2 s while it runs; keep the
    scrapes that saw requests running."""
    import aiohttp

    from vllm_pp_cudagraph.commands.bench.serve_run import vllm_bench_serve_command

    bench = await asyncio.create_subprocess_exec(
        *vllm_bench_serve_command(base_url, model_dir, concurrency=64, num_prompts=512,
                                  input_len=64, output_len=256, result_dir=out,
                                  result_name="bench-serve.json"),
        stdout=(out / "bench-serve.log").open("w"), stderr=asyncio.subprocess.STDOUT)
    busy = []
    async with aiohttp.ClientSession() as session:
        while bench.returncode is None:
            await asyncio.sleep(2)
            async with session.get(f"{base_url}/metrics") as response:
                text = await response.text()
            found = samples(text)
            if any(n == "running_requests" and v > 0 for n, _, v in found):
                busy.append(text)
            try:
                await asyncio.wait_for(bench.wait(), 0.01)
            except asyncio.TimeoutError:
                pass
    (out / "metrics-under-load.txt").write_text("\n\n".join(busy[-3:]))
    return {"scrapes_under_load": len(busy), "last": busy[-1] if busy else "",
            "bench_rc": bench.returncode}


def test_serve_reports_every_stage_in_metrics_and_the_log(tmp_path):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
    from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec
    from vllm_pp_cudagraph.commands.bench.serve_run import serve_and_call

    # vllm bench serve tokenizes its random prompts: this model has a tokenizer.
    random_model = write_model_dir(tmp_path / "model", "qwen3-0.6b", tokenizer=True,
                                   weights=True)
    spec = RunSpec(runner="plugin", mode="full_and_piecewise", pp=2, workload="serve",
                   max_num_seqs=64, extra_env={"VLLM_LOG_STATS_INTERVAL": "5"})
    log = tmp_path / "serve.log"
    report = serve_and_call(spec, str(random_model), log,
                            lambda url: scrape_under_load(url, str(random_model), tmp_path),
                            port=8410)
    (tmp_path / "report.json").write_text(json.dumps(
        {k: v for k, v in report.items() if k != "last"}, indent=1))
    assert "error" not in report and report["bench_rc"] == 0, report
    assert report["scrapes_under_load"] >= 2, "no scrape saw requests running"
    found = samples(report["last"])
    for stage in ("0", "1"):
        names = {n for n, labels, _ in found if labels.get("stage") == stage}
        assert set(STAGE_SERIES) <= names, (stage, set(STAGE_SERIES) - names)
    value = {(n, labels.get("stage"), labels.get("group")): v for n, labels, v in found}
    for stage in ("0", "1"):
        assert 0 < value[("stage_busy_ratio", stage, None)] <= 1
        assert 0 <= value[("stage_wait_ratio", stage, None)] < 1
        assert value[("stage_step_seconds", stage, None)] > 0
        assert value[("stage_reporting", stage, None)] == 1
        assert value[("stage_graph_steps_total", stage, None)] > 0
    assert value[("stage_handoff_bytes_total", "0", None)] > 0
    assert value[("stage_layers", "0", None)] + value[("stage_layers", "1", None)] == 28
    groups = [v for (n, _, _), v in value.items() if n == "decode_group_size"]
    assert len(groups) == 2 and sum(groups) == value[("running_requests", None, None)]
    assert any(n == "cadence" and v == 1 for n, _, v in found)
    text = log.read_text()
    assert re.search(r"Pipeline: stage 0 busy \d+%, waits \d+%; stage 1 busy", text), \
        "no pipeline line in the server's log"
    print(json.dumps({"scrapes": report["scrapes_under_load"]}), file=sys.stderr)
