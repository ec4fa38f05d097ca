"""What a soak watches on each server under load, and what it fails a run for."""

from __future__ import annotations

import asyncio

from _local_server import local_server
from aiohttp import web

from benchmarks.tools import soak_watch
from benchmarks.tools.soak_watch import (
    MEMORY_GROWTH_MIB,
    SETTLE_S,
    SILENT_S,
    ServerWatch,
    first_traffic_problems,
    requests_in_server,
    watch_problems,
    watch_summary,
)
from vllm_pp_cudagraph.shared.snapshots import StageSnapshot, write_snapshot


def _sample(at: float, gpu_mib: dict | None, stages: dict[str, float]) -> dict:
    return {"time": at, "gpu_mib": gpu_mib,
            "stages": {s: {"time": written, "steps": 10, "busy": 1.0}
                       for s, written in stages.items()}}


def _watch(samples: list[dict], left: int | None = 0, pp: int = 2) -> dict:
    # The last sample is the one taken after the load ended.
    return {"pp_size": pp, "samples": samples, "under_load": len(samples) - 1,
            "requests_left": left}


def steady(pp: int = 2, seconds: int = 60) -> dict:
    """Both stages writing every 5 s, memory flat: a clean watch."""
    samples = [_sample(t, {"0": 70_000, "1": 70_000}, {str(s): t - 1 for s in range(pp)})
               for t in range(0, seconds + 1, 10)]
    return _watch(samples, pp=pp)


def test_a_steady_server_passes():
    assert watch_problems(steady(), plugin=True) == []


def test_memory_that_grows_under_load_fails_the_run():
    watch = steady()
    watch["samples"][-1]["gpu_mib"] = {"0": 70_000 + MEMORY_GROWTH_MIB + 1, "1": 70_000}
    assert watch_problems(watch, plugin=True) == [
        f"GPU 0: memory grew by {MEMORY_GROWTH_MIB + 1} MiB after the load's first "
        f"{SETTLE_S:.0f} s (at most {MEMORY_GROWTH_MIB})"]
    watch["samples"][-1]["gpu_mib"]["0"] = 70_000 + MEMORY_GROWTH_MIB
    assert watch_problems(watch, plugin=True) == []


def first_traffic(watch: dict, took: dict[str, int]) -> dict:
    """``watch`` with each GPU's memory raised by ``took`` from its second sample on, as
    vLLM's workspaces are allocated on the first requests."""
    for sample in watch["samples"][1:]:
        sample["gpu_mib"] = {gpu: used + took.get(gpu, 0)
                             for gpu, used in sample["gpu_mib"].items()}
    return watch


def test_memory_taken_by_the_first_requests_then_flat_passes():
    watch = first_traffic(steady(seconds=300), {"0": 2578, "1": 2344})
    assert watch_problems(watch, plugin=True) == []
    summary = watch_summary(watch)
    assert summary["gpu_mib_start"] == {"0": 70_000, "1": 70_000}
    assert summary["gpu_mib_settled"] == summary["gpu_mib_end"] == {"0": 72_578, "1": 72_344}


def test_memory_that_grows_after_the_first_minute_fails_the_run():
    watch = first_traffic(steady(seconds=300), {"0": 2578, "1": 2344})
    for sample in watch["samples"]:
        if sample["time"] > SETTLE_S:
            sample["gpu_mib"]["1"] += MEMORY_GROWTH_MIB + 1
    assert watch_problems(watch, plugin=False) == [
        f"GPU 1: memory grew by {MEMORY_GROWTH_MIB + 1} MiB after the load's first "
        f"{SETTLE_S:.0f} s (at most {MEMORY_GROWTH_MIB})"]


def test_the_plugin_may_take_no_more_on_its_first_requests_than_stock():
    def watch_of(gpus: tuple[str, str], took: tuple[int, int]) -> dict:
        watch = steady(seconds=300)
        for sample in watch["samples"]:
            sample["gpu_mib"] = dict(zip(gpus, sample["gpu_mib"].values()))
        return first_traffic(watch, dict(zip(gpus, took)))

    stock = watch_of(("2", "3"), (2578, 2340))  # beside the plugin, on other GPUs
    assert first_traffic_problems(watch_of(("0", "1"), (2578, 2344)), stock) == []
    more = watch_of(("0", "1"), (2578, 2340 + MEMORY_GROWTH_MIB + 1))
    assert first_traffic_problems(more, stock) == [
        f"GPU 1: its first {SETTLE_S:.0f} s of load took {2340 + MEMORY_GROWTH_MIB + 1} MiB, "
        f"stock's 2340 MiB (at most {MEMORY_GROWTH_MIB} more)"]
    # Without stock's watch there is nothing to hold it to.
    assert first_traffic_problems(more, None) == []


def test_a_stage_whose_snapshot_stops_under_load_went_silent():
    watch = steady(seconds=80)
    for sample in watch["samples"]:
        if sample["time"] >= 20:
            sample["stages"]["1"]["time"] = 19  # stage 1's last write, at 19 s
    [problem] = watch_problems(watch, plugin=True)
    assert problem.startswith("stage 1 went silent for ") and "under load" in problem
    quiet = float(problem.split("for ")[1].split(" s")[0])
    assert quiet > SILENT_S
    # Stock writes no snapshots: its watch is not held to them.
    assert watch_problems(watch, plugin=False) == []


def test_a_stage_that_never_wrote_fails_the_plugin_run():
    watch = steady(pp=2)
    for sample in watch["samples"]:
        del sample["stages"]["1"]
    assert watch_problems(watch, plugin=True) == ["stage 1 wrote no snapshot"]


def test_requests_left_after_the_load_fail_the_run():
    assert watch_problems(_watch(steady()["samples"], left=3), plugin=False) == [
        f"3 requests still running or waiting {soak_watch.DRAIN_S:.0f} s after the load ended"]


def test_a_server_never_watched_fails_the_run():
    assert watch_problems(None, plugin=False) == ["no watch of the server while its load ran"]


def test_the_requests_in_a_server_are_read_from_its_metrics():
    text = ('# HELP vllm:num_requests_running x\n'
            'vllm:num_requests_running{engine="0",model_name="dummy"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="dummy"} 1.0\n'
            'vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0\n\n')
    assert requests_in_server(text) == 3
    assert requests_in_server("vllm:other 1.0\n") is None


def _stage(stage: int, at: float) -> StageSnapshot:
    return StageSnapshot(stage=stage, pp_size=2, tp_size=1, time=at, window_s=5.0, steps=40,
                         busy_fraction=0.99, wait_fraction=0.01, step_ms=30.0,
                         handoff_bytes_total=0, graph_steps_total=40, eager_steps_total=0,
                         layers=14)


def test_a_watch_samples_the_stage_records_and_asks_the_server_what_is_left(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(soak_watch, "gpu_memory_mib", lambda gpus: {"0": 1000, "1": 1000})
    for stage in (0, 1):
        write_snapshot(_stage(stage, at=100.0), tmp_path)
    metrics = {"running": 0}

    async def serve_metrics(request: web.Request) -> web.Response:
        return web.Response(text=f"vllm:num_requests_running{{}} {metrics['running']}\n")

    async def run() -> dict:
        app = web.Application()
        app.router.add_get("/metrics", serve_metrics)
        async with local_server(app) as base_url:
            watch = ServerWatch("0,1", tmp_path, pp_size=2, interval_s=0.05)
            watch.start()
            await asyncio.sleep(0.2)
            write_snapshot(_stage(1, at=101.0), tmp_path)
            await asyncio.sleep(0.2)
            return await asyncio.to_thread(watch.finish, base_url)

    found = asyncio.run(run())
    assert found["requests_left"] == 0 and found["pp_size"] == 2
    assert found["under_load"] >= 4 and len(found["samples"]) == found["under_load"] + 1
    assert found["samples"][0]["stages"]["1"]["time"] == 100.0
    assert found["samples"][-1]["stages"]["1"]["time"] == 101.0
    assert found["samples"][-1]["gpu_mib"] == {"0": 1000, "1": 1000}
    assert watch_problems(found, plugin=True) == []
