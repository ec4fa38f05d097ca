"""The offline workloads' passes: each timed pass prefills its prompts itself."""

from __future__ import annotations

import inspect
import time
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.commands.bench import engine_run
from vllm_pp_cudagraph.commands.bench.runs import RunSpec


class _Engine:
    """Stands in for vLLM's ``LLM`` (no GPU here): records what the bench asks of it.
    ``busy`` answers a reset with False that many times first, as vLLM does while a
    finished request's blocks are still held."""

    def __init__(self, busy: int = 0):
        self.calls: list[str] = []
        self.busy = busy

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset")
        if self.busy:
            self.busy -= 1
            return False
        return True

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append("generate")
        time.sleep(0.002)  # a pass takes time: its rate divides by it
        metrics = SimpleNamespace(first_token_latency=0.01, first_token_ts=1.0,
                                  last_token_ts=1.5, num_generation_tokens=4)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2, 3, 4])],
                                metrics=metrics) for _ in prompts]

    def get_metrics(self):
        return []


def _run(monkeypatch, engine: _Engine, **spec) -> dict:
    monkeypatch.setattr(engine_run, "start_engine", lambda s: (engine, 1.0))
    monkeypatch.setattr(engine_run.empty_prefix_cache, "__defaults__", (50, 0.0))
    return engine_run._child(RunSpec("stock", "eager", workload="engine", prompts=4,
                                     input_len=8, output_len=4, **spec))


def test_every_timed_pass_starts_from_an_empty_prefix_cache(monkeypatch):
    """Every pass sends the same prompts, and vLLM caches prefixes by default: without
    emptying the cache, a timed pass would find the warm-up's prompts cached and skip
    their prefill."""
    engine = _Engine()
    report = _run(monkeypatch, engine, repeat=2)
    assert engine.calls == ["generate", "reset", "generate", "reset", "generate"]
    assert report["prefix_cache_emptied"] is True


def test_a_cache_vllm_will_not_empty_yet_is_asked_again_then_reported(monkeypatch):
    engine = _Engine(busy=3)
    assert _run(monkeypatch, engine, repeat=1)["prefix_cache_emptied"] is True
    assert engine.calls == ["generate", "reset", "reset", "reset", "reset", "generate"]
    stuck = _Engine(busy=10**6)
    assert _run(monkeypatch, stuck, repeat=1)["prefix_cache_emptied"] is False


def test_vllms_llm_empties_its_prefix_cache_when_asked_without_arguments():
    from vllm import LLM

    params = inspect.signature(LLM.reset_prefix_cache).parameters
    assert all(p.default is not inspect.Parameter.empty
               for name, p in params.items() if name != "self")


@pytest.mark.parametrize("emptied, shown", [(False, True), (True, False), (None, False)])
def test_the_console_says_when_a_pass_may_have_found_its_prompts_cached(emptied, shown,
                                                                       capsys):
    import argparse

    from vllm_pp_cudagraph.commands.bench.report import print_findings

    run = {"spec": {"runner": "plugin", "mode": "eager"}, "prefix_cache_emptied": emptied}
    print_findings(argparse.Namespace(pp=2), [run], [])
    assert ("PREFIX CACHE KEPT: plugin:eager" in capsys.readouterr().out) is shown
