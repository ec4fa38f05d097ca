"""A soak cut short resumes: the servers that finished are not served again.

The soak's servers are faked (what they serve is their report); the plumbing,
the saved reports, the token check and the verdict are the soak's own."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_soak_watch import steady

from benchmarks.tools.soak_judge import GreedyCheck
from vllm_pp_cudagraph.commands.bench.serve_load import LoadReport, RequestResult


class MachineGone(Exception):
    """The host went away mid-soak."""


def _served(texts: list[str]) -> dict:
    report = LoadReport([RequestResult(i, stream=True, text=t, prompt_token_ids=[3, 4],
                                       token_ids=[7, i], ttft_s=0.25, chunk_times=[0.5, 0.75])
                         for i, t in enumerate(texts)],
                        elapsed_s=1.0, health_checks=1, health_failures=[])
    return {"load_report": report, "load": report.summary(), "preemptions": 0,
            "shutdown_clean": True, "shutdown_rc": 0, "watch": steady()}


@pytest.fixture
def fake_servers(tmp_path, monkeypatch):
    """Fake servers for soak.main; ``served`` lists the logs of those that served,
    and a server whose log is named in ``gone_at`` takes the machine away."""
    import benchmarks.tools.soak as soak

    state = {"served": [], "scored": [], "gone_at": None, "serve_args": {}}

    def fake_serve(spec, model_dir, load, log_path, **kwargs):
        if log_path.name == state["gone_at"]:
            raise MachineGone(log_path.name)
        state["served"].append(log_path.name)
        state["serve_args"][log_path.name] = kwargs["extra_args"]
        return _served(["same text", "other text", "third"])

    def fake_serve_and_call(spec, model_dir, log_path, call, **kwargs):
        state["serve_args"][log_path.name] = kwargs["extra_args"]
        return {**asyncio.run(call("http://fake")), "shutdown_rc": 0}

    async def fake_score(base_url, model, sequences):
        state["scored"].append(len(sequences))
        return GreedyCheck(len(sequences), 10, 0, 0.0, [], [])

    monkeypatch.setattr(soak, "write_model_dir", lambda *a, **k: tmp_path / "model")
    monkeypatch.setattr(soak.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(soak, "run_serve_mode", fake_serve)
    monkeypatch.setattr(soak, "serve_and_call", fake_serve_and_call)
    monkeypatch.setattr(soak, "score_greedy", fake_score)
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    return soak, state


def test_a_resumed_soak_serves_only_what_was_left_and_judges_every_server(tmp_path, fake_servers):
    soak, state = fake_servers
    out = tmp_path / "soak"
    argv = ["--out", str(out), "--modes", "eager", "--token-check", "--gpus", "0,1"]
    state["gone_at"] = "eager-stock-b.log"
    with pytest.raises(MachineGone):
        soak.main(argv)
    assert state["served"] == ["eager-plugin.log", "eager-stock-a.log"]
    assert sorted(p.name for p in (out / "servers").iterdir()) == [
        "eager-plugin.json", "eager-stock-a.json"]
    assert not (out / "soak.json").exists()

    state.update(served=[], gone_at=None)
    assert soak.main(argv + ["--resume"]) == 0
    assert state["served"] == ["eager-stock-b.log"]
    [result] = json.loads((out / "soak.json").read_text())
    assert result["passed"] and result["stock_vs_stock"] == 0 and result["plugin_vs_stock"] == 0
    # the resumed servers' outputs were scored like the new one's
    assert set(result["token_check"]) >= {"plugin", "stock_a", "stock_b"}
    assert state["scored"] == [3, 3, 3]


def test_the_token_check_serves_sequences_as_long_as_the_servers_it_scores_allowed(
        tmp_path, fake_servers):
    """Under --preemption the servers cap the model length; the scoring server must
    take that cap too."""
    soak, state = fake_servers
    argv = ["--out", str(tmp_path / "soak"), "--modes", "eager", "--token-check", "--gpus", "0,1",
            "--preemption"]
    soak.main(argv)  # its verdict is not the point: faked servers preempt nothing

    def model_len(args: list[str]) -> str | None:
        return args[args.index("--max-model-len") + 1] if "--max-model-len" in args else None

    scorer = state["serve_args"].pop("eager-token-check.log")
    assert set(state["serve_args"]) == {
        "eager-plugin.log", "eager-stock-a.log", "eager-stock-b.log"}
    assert {model_len(a) for a in state["serve_args"].values()} == {model_len(scorer)} != {None}


def test_without_resume_a_soak_serves_everything_again(tmp_path, fake_servers):
    soak, state = fake_servers
    argv = ["--out", str(tmp_path / "soak"), "--modes", "eager", "--gpus", "0,1"]
    assert soak.main(argv) == 0
    state["served"] = []
    assert soak.main(argv) == 0
    assert state["served"] == ["eager-plugin.log", "eager-stock-a.log", "eager-stock-b.log"]


def test_a_report_saved_under_other_settings_stops_the_resume_naming_them(tmp_path, fake_servers):
    soak, state = fake_servers
    out = tmp_path / "soak"
    state["gone_at"] = "eager-stock-a.log"
    with pytest.raises(MachineGone):
        soak.main(["--out", str(out), "--modes", "eager", "--gpus", "0,1", "--requests", "500"])
    state.update(served=[], gone_at=None)
    with pytest.raises(SystemExit, match=r"--requests 500 there, 2000 now"):
        soak.main(["--out", str(out), "--modes", "eager", "--gpus", "0,1", "--resume"])
    assert state["served"] == []


def test_a_saved_report_reads_back_as_it_was_served(tmp_path):
    import argparse

    from benchmarks.tools import soak_store

    settings = soak_store.run_settings(argparse.Namespace(
        **{name: None for name in soak_store.RUN_SETTINGS}))
    served = _served(["a b", "c"])
    soak_store.save_report(tmp_path, "piecewise", "stock_a", served, settings)
    back = soak_store.load_report(tmp_path, "piecewise", "stock_a", settings)
    assert back["load_report"] == served["load_report"]
    assert {k: v for k, v in back.items() if k != "load_report"} == {
        k: v for k, v in served.items() if k != "load_report"}
    assert soak_store.load_report(tmp_path, "piecewise", "stock_b", settings) is None
