"""A ``vllm serve`` that dies at start-up is reported at once, with its exit code.

On this CPU-only machine the real ``vllm serve`` cannot find a device and exits;
the soak must say so and point at the log instead of polling ``/health`` until
its start-up timeout runs out.
"""

import time
from importlib import metadata

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec
from vllm_pp_cudagraph.commands.bench.serve_load import LoadSpec
from vllm_pp_cudagraph.commands.bench.serve_run import run_serve_mode, serve_command


def _serve_in_process(spec, model_dir, log_path, call, port, startup_timeout_s, extra_args=()):
    """Stands in for ``serve_and_call``: no server, the passes' client commands run as they are."""
    import asyncio

    log_path.write_text("")
    return {**asyncio.run(call("http://unused")), "shutdown_rc": 0, "shutdown_clean": True}


def test_serve_command_carries_pp_and_graph_mode(tmp_path):
    cmd = serve_command(RunSpec("plugin", "full_decode_only", pp=2), str(tmp_path), 8123)
    assert cmd[cmd.index("--pipeline-parallel-size") + 1] == "2"
    assert any("FULL_DECODE_ONLY" in arg for arg in cmd)


def test_server_that_exits_at_start_is_reported_with_its_exit_code(tmp_path):
    model_dir = str(write_model_dir(tmp_path / "model", tokenizer=True))
    log_path = tmp_path / "serve.log"
    start = time.monotonic()
    report = run_serve_mode(
        RunSpec("plugin", "eager", pp=2),
        model_dir,
        LoadSpec("", "", ["hello"], 1, 1, 1),
        log_path,
        port=8123,
        startup_timeout_s=600,
    )
    assert time.monotonic() - start < 300
    assert "exited with rc=" in report["error"] and "serve.log" in report["error"]
    assert "load" not in report
    assert report["shutdown_clean"] is False
    assert "Traceback" in log_path.read_text()
    # A failed run is where a reader most needs to know what it ran with.
    assert report["spec"]["vllm_version"] == metadata.version("vllm")
    assert report["spec"]["torch_version"] == metadata.version("torch")


def test_a_profiled_serve_sweep_gives_each_concurrency_its_own_per_stage_profile(
    tmp_path, monkeypatch
):
    """``bench --workload serve --profile``: the server gets vLLM's profiler config,
    each concurrency gets one more pass between /start_profile and /stop_profile, and
    that pass's traces (one per stage) are summarised into its own point."""
    import asyncio
    import json
    import sys

    from _local_server import local_server
    from aiohttp import web

    from vllm_pp_cudagraph.commands.bench import serve_run

    profile_dir = tmp_path / "traces"
    calls: list[str] = []

    async def start(request):
        calls.append("start")
        return web.Response()

    async def stop(request):
        calls.append("stop")
        for rank in range(2):  # the workers write their traces as profiling stops
            (profile_dir / f"worker{rank}.{len(calls)}.pt.trace.json.gz").write_text("x")
        return web.Response()

    app = web.Application()
    app.router.add_post("/start_profile", start)
    app.router.add_post("/stop_profile", stop)
    served = {}

    def fake_serve_and_call(spec, model_dir, log_path, call, port, startup_timeout_s,
                            extra_args=()):
        served["extra_args"] = list(extra_args)
        log_path.write_text("")

        async def run():
            async with local_server(app) as base_url:
                return await call(base_url)

        return {**asyncio.run(run()), "shutdown_rc": 0, "shutdown_clean": True}

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        calls.append(f"pass c{concurrency} n{num_prompts}")
        result = {"request_throughput": 10.0 + concurrency, "completed": num_prompts}
        return [sys.executable, "-c",
                f"open({str(result_dir / result_name)!r}, 'w').write({json.dumps(result)!r})"]

    monkeypatch.setattr(serve_run, "serve_and_call", fake_serve_and_call)
    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    monkeypatch.setattr(serve_run, "analyze_dir", lambda d: {
        f"rank{i}": {"gpu_busy_pct": 80.0 + i, "traces": sorted(p.name for p in d.iterdir())}
        for i in range(2)})
    spec = RunSpec("plugin", "full_and_piecewise", pp=2, repeat=1, workload="serve",
                   profile_dir=str(profile_dir))
    points = serve_run.run_vllm_bench_sweep(spec, str(tmp_path), tmp_path / "serve.log",
                                            [64, 256], 512)
    config = served["extra_args"][served["extra_args"].index("--profiler-config") + 1]
    assert json.loads(config)["torch_profiler_dir"] == str(profile_dir)
    assert calls == ["pass c64 n128", "pass c64 n512", "start", "pass c64 n128", "stop",
                     "pass c256 n256", "pass c256 n512", "start", "pass c256 n256", "stop"]
    assert [p["concurrency"] for p in points] == [64, 256]
    assert points[1]["pass_req_per_s"] == [266.0] and points[1]["pass_tpot_p99_ms"] == [None]
    assert [p["gpu_busy_pct"] for p in points] == [[80.0, 81.0], [80.0, 81.0]]
    # Each concurrency's profile is made of its own pass's traces only.
    assert points[0]["profile"]["rank0"]["traces"] == ["worker0.5.pt.trace.json.gz",
                                                      "worker1.5.pt.trace.json.gz"]
    assert points[1]["profile"]["rank0"]["traces"] == ["worker0.10.pt.trace.json.gz",
                                                      "worker1.10.pt.trace.json.gz"]
    assert not list(profile_dir.glob("*.pt.trace.json*"))


def test_a_sweep_of_input_lengths_and_concurrencies_runs_on_one_server(tmp_path, monkeypatch):
    """``--points IN:C,...``: each point's passes carry its own input length, a pass
    sends at least two requests per request in flight, and each report says its point."""
    import sys

    from vllm_pp_cudagraph.commands.bench import serve_run

    starts, passes = [], []

    def fake_serve_and_call(spec, model_dir, log_path, call, port, startup_timeout_s,
                            extra_args=()):
        starts.append(spec.input_len)
        return _serve_in_process(spec, model_dir, log_path, call, port, startup_timeout_s)

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        passes.append((input_len, concurrency, num_prompts))
        result = {"request_throughput": float(input_len + concurrency)}
        return [sys.executable, "-c",
                f"import json; json.dump({result!r}, open({str(result_dir / result_name)!r}, 'w'))"]

    monkeypatch.setattr(serve_run, "serve_and_call", fake_serve_and_call)
    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    spec = RunSpec("plugin", "full_and_piecewise", pp=2, repeat=1, workload="serve",
                   input_len=2)
    reports = serve_run.run_vllm_bench_sweep(spec, str(tmp_path), tmp_path / "serve.log",
                                             [(64, 256), (64, 1024), (1024, 256)], 512)
    assert starts == [2]
    # Each point is warmed at its own concurrency, with a request per slot at least.
    assert passes == [(64, 256, 256), (64, 256, 512), (64, 1024, 1024), (64, 1024, 2048),
                      (1024, 256, 256), (1024, 256, 512)]
    assert [(r["input_len"], r["concurrency"], r["req_per_s"]) for r in reports] == [
        (64, 256, 320.0), (64, 1024, 1088.0), (1024, 256, 1280.0)]
    # What each timed pass sent, beside the spec's --prompts.
    assert [r["requests_per_pass"] for r in reports] == [512, 2048, 512]


def test_no_pass_finds_its_prompts_in_the_prefix_cache_and_every_runner_gets_the_same(
        tmp_path, monkeypatch):
    """vLLM caches prompt prefixes by default: a pass whose prompts an earlier pass on the
    same server already sent skips most of its prefill, so each pass (warm-ups included,
    across points) must draw its own prompts. The runners compared must draw the same."""
    import sys

    from vllm_pp_cudagraph.commands.bench import serve_run

    seeds: list[int] = []

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        seeds.append(seed)
        return [sys.executable, "-c", f"open({str(result_dir / result_name)!r}, 'w').write('{{}}')"]

    monkeypatch.setattr(serve_run, "serve_and_call", _serve_in_process)
    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    by_runner = {}
    for runner in ("plugin", "stock"):
        seeds.clear()
        spec = RunSpec(runner, "full_and_piecewise", pp=2, repeat=2, workload="serve")
        serve_run.run_vllm_bench_sweep(spec, str(tmp_path / runner), tmp_path / f"{runner}.log",
                                       [(64, 64), (64, 256)], 512)
        by_runner[runner] = list(seeds)
    assert len(by_runner["plugin"]) == 6  # a warm-up and two timed passes per point
    assert len(set(by_runner["plugin"])) == 6
    assert by_runner["plugin"] == by_runner["stock"]


def test_the_client_command_carries_the_passes_seed(tmp_path):
    from vllm_pp_cudagraph.commands.bench.serve_run import vllm_bench_serve_command

    cmd = vllm_bench_serve_command("http://h:1", "/m", 8, 16, 64, 32, tmp_path, "r.json",
                                   seed=12345)
    assert cmd[cmd.index("--seed") + 1] == "12345"


def test_each_timed_pass_reports_its_stages_step_time(tmp_path, monkeypatch):
    """The stages' snapshots read around each pass give that pass's mean step time and
    busy share per stage (what the last window, a run's drain, cannot say)."""
    import json
    import sys

    from vllm_pp_cudagraph.commands.bench import serve_run
    from vllm_pp_cudagraph.commands.bench.engine_run import records_dir_of
    from vllm_pp_cudagraph.shared.snapshots import StageSnapshot

    records = records_dir_of(tmp_path / "serve.log")
    totals = {"steps": 0, "busy": 0.0}

    def fake_serve_and_call(spec, model_dir, log_path, call, port, startup_timeout_s,
                            extra_args=()):
        records.mkdir(exist_ok=True)
        return _serve_in_process(spec, model_dir, log_path, call, port, startup_timeout_s)

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        # Each pass: 100 steps on each stage, at 40 ms, 41 ms, ... pass by pass.
        totals["busy"] += 100 * (40.0 + totals["steps"] // 100)
        totals["steps"] += 100
        files = {f"stage-{stage}.json": StageSnapshot(
            stage=stage, pp_size=2, tp_size=1, time=1.0, window_s=5.0, steps=5,
            busy_fraction=1.0, wait_fraction=0.0, step_ms=1.0, handoff_bytes_total=0,
            graph_steps_total=0, eager_steps_total=0, timed_steps_total=totals["steps"],
            busy_ms_total=totals["busy"], idle_ms_total=0.0, layers=14).to_json()
            for stage in (0, 1)}
        files[result_name] = json.dumps({"request_throughput": 10.0})
        writes = "; ".join(f"open({str((records if n.startswith('stage') else result_dir) / n)!r},"
                           f" 'w').write({text!r})" for n, text in files.items())
        return [sys.executable, "-c", writes]

    monkeypatch.setattr(serve_run, "serve_and_call", fake_serve_and_call)
    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    spec = RunSpec("plugin", "full_and_piecewise", pp=2, repeat=2, workload="serve")
    [report] = serve_run.run_vllm_bench_sweep(spec, str(tmp_path), tmp_path / "serve.log",
                                              [64], 128)
    # The warm-up ran at 40 ms a step, then the two timed passes at 41 and 42.
    assert report["pass_stage_step_ms"] == [[41.0, 41.0], [42.0, 42.0]]
    assert report["pass_stage_busy"] == [[1.0, 1.0], [1.0, 1.0]]


def test_lanes_meet_before_each_point_and_a_lane_left_alone_goes_on(tmp_path):
    """Two bench invocations side by side: the earlier lane waits for the later one at
    each point of the same run; where the other never comes, it goes on after its timeout."""
    import threading

    from vllm_pp_cudagraph.commands.bench.lanes import LaneSync

    a = LaneSync(tmp_path / "sync", "a", poll_s=0.05)
    b = LaneSync(tmp_path / "sync", "b", poll_s=0.05)
    for lane in (a, b):
        lane.next_run()
    waited = {}
    thread = threading.Thread(target=lambda: waited.setdefault("a", a.meet("c1024")))
    thread.start()
    time.sleep(0.5)
    waited["b"] = b.meet("c1024")
    thread.join(timeout=5)
    assert waited["a"] >= 0.4 and waited["b"] < 0.2
    # The next run's point is a new meeting: b alone there times out instead of hanging,
    # and at once where a's server of that run did not serve.
    b.next_run()
    b.timeout_s = 0.3
    assert b.meet("c1024") is None
    a.next_run(), a.next_run(), b.next_run()  # both at their third run
    b.timeout_s = 60
    a.leave()
    started = time.monotonic()
    assert b.meet("c1024") is None and time.monotonic() - started < 5


def test_a_lanes_sweep_records_its_waits_and_when_each_pass_ran(tmp_path, monkeypatch):
    import sys

    from vllm_pp_cudagraph.commands.bench import lanes, serve_run

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        return [sys.executable, "-c", f"import json; json.dump({{'request_throughput': 1.0}}, "
                f"open({str(result_dir / result_name)!r}, 'w'))"]

    monkeypatch.setattr(serve_run, "serve_and_call", _serve_in_process)
    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    monkeypatch.setattr(lanes, "current", lanes.LaneSync(tmp_path / "sync", "a", lanes=1))
    spec = RunSpec("stock", "full_and_piecewise", pp=2, repeat=2, workload="serve", input_len=2)
    for run in (1, 2):
        [report] = serve_run.run_vllm_bench_sweep(spec, str(tmp_path), tmp_path / f"{run}.log",
                                                  [(64, 8)], 16)
        assert report["lane_wait_s"] is not None
        assert len(report["pass_started"]) == 2
        assert report["pass_started"][0] <= report["pass_ended"][0] <= report["pass_started"][1]
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == [
        "run1-in64-c8.a", "run2-in64-c8.a"]


def test_open_loop_arrivals_go_to_vllms_client_with_the_concurrency_as_a_cap(tmp_path):
    from vllm_pp_cudagraph.commands.bench.serve_run import vllm_bench_serve_command

    def flags(cmd):
        return {k: v for k, v in zip(cmd, cmd[1:]) if k.startswith("--")}

    closed = vllm_bench_serve_command("http://h", "m", 256, 512, 64, 256, tmp_path, "r.json")
    assert "--request-rate" not in closed and flags(closed)["--max-concurrency"] == "256"
    opened = flags(vllm_bench_serve_command("http://h", "m", 1024, 2048, 64, 256, tmp_path,
                                            "r.json", request_rate=34.0))
    assert (opened["--request-rate"], opened["--max-concurrency"]) == ("34.0", "1024")


def test_a_runs_arrival_rate_reaches_each_pass(tmp_path, monkeypatch):
    import asyncio
    import sys

    from vllm_pp_cudagraph.commands.bench import serve_run

    rates = []

    def fake_client(base_url, model_dir, concurrency, num_prompts, input_len, output_len,
                    result_dir, result_name, request_rate=None, seed=0):
        rates.append(request_rate)
        return [sys.executable, "-c", "pass"]

    monkeypatch.setattr(serve_run, "vllm_bench_serve_command", fake_client)
    spec = RunSpec("plugin", "full_and_piecewise", pp=2, repeat=2, workload="serve",
                   request_rate=30.0)
    client = serve_run.BenchServeClient(spec, str(tmp_path), tmp_path, 64)
    asyncio.run(client.point("http://unused", 64))
    assert rates == [30.0, 30.0, 30.0]  # the warm-up and both timed passes
