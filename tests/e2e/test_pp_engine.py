"""End-to-end checks on GPUs: the plugin inside real PP=2 vLLM engines and servers.

Each check drives the repository's own tooling as a GPU run would: the
``bench`` CLI for tokens per graph mode, ``benchmarks.tools.serve_checks``
for structured outputs and a stage fault, ``benchmarks.tools.soak`` for a
short serving soak and the start-up refusals. Skipped without 2 CUDA devices;
longer runs of the same tools are committed under benchmarks/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("two_gpus")]

#: The graph modes the bench compares by default, plugin against stock.
GRAPH_MODES = ("eager", "piecewise", "full_and_piecewise", "full_decode_only", "breakable")


def _run_batch_bench(out, model, modes: str, env: dict | None = None):
    """``bench --workload batch`` with ``modes``; the process and its runs by runner."""
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.cli", "bench", "--workload", "batch",
         "--model", str(model), "--modes", modes,
         "--repeat", "0", "--timeout", "600", "--out", str(out)],
        capture_output=True, text=True, timeout=1500, env=env,
    )
    path = out / "bench.json"
    runs = {r["spec"]["runner"]: r for r in json.loads(path.read_text())["runs"]} \
        if path.exists() else {}
    return proc, runs


def _batch_bench(tmp_path, model, runner: str, mode: str) -> tuple[dict, dict, str, int]:
    """Run ``bench --workload batch`` for stock and ``runner`` in ``mode``; their reports.

    The runner's greedy tokens must equal stock's. A freshly compiled engine can give
    other tokens than the rest, stock's as well (seen on vLLM 0.33 in PIECEWISE), so
    where they differ a second stock engine, compiled afresh, decides: the runner
    passes only if it gave exactly that engine's tokens.
    """
    out = tmp_path / "bench"
    proc, runs = _run_batch_bench(out, model, f"stock:{mode},{runner}:{mode}")
    console = proc.stdout[-4000:] + proc.stderr[-2000:]
    assert runs, console
    plugin, stock = runs[runner], runs["stock"]
    assert plugin.get("digest"), f"the plugin's engine failed (see {out}/{runner}-{mode}.log)"
    assert plugin["plugin_stages"] == 2, "a stage ran without the plugin's runner"
    assert stock.get("plugin_stages", 0) == 0, "stock ran with the plugin loaded"
    assert stock.get("digest"), f"stock's engine failed (see {out}/stock-{mode}.log)"
    if plugin["tokens_agree"] is not True:
        again_out = tmp_path / "stock-again"
        _, again = _run_batch_bench(again_out, model, f"stock:{mode}",
                                    env=dict(os.environ, VLLM_DISABLE_COMPILE_CACHE="1"))
        again_digests = again.get("stock", {}).get("request_digests")
        what = ("failed" if not again_digests else
                "gave the first stock engine's tokens" if again_digests == stock["request_digests"]
                else "gave other tokens again")
        assert again_digests == plugin["request_digests"], (
            f"{plugin.get('requests_differ')} requests differ from {plugin.get('tokens_reference')}; "
            f"a second stock engine compiled afresh {what} (see {again_out})"
        )
        print(f"{runner}:{mode}: stock's first engine left the usual tokens; a second one, "
              "compiled afresh, gave the plugin's")
    return plugin, stock, console, proc.returncode


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_plugin_tokens_equal_stock_per_graph_mode(mode, tmp_path, random_model):
    """``vllm-pp-cudagraph bench --workload batch``: requests queued as one batch, and
    the plugin's greedy tokens must equal stock's. Its default cadence may group the
    decodes otherwise than stock's (it chooses by measured time); on this dense shape
    that has never changed a token, while MoE shapes are checked on vLLM's cadence
    (``plugin-cadence``, the GPU matrix's moe jobs). The plugin's
    runner must have run on both stages, the report names what it ran on, and the first
    stage did not compile its update with the last stage's tokens while serving."""
    import torch

    plugin, _, console, returncode = _batch_bench(tmp_path, random_model, "plugin", mode)
    spec = plugin["spec"]
    assert spec["vllm_version"] and spec["torch_version"], spec
    assert spec["gpu"] == torch.cuda.get_device_name(0), spec
    assert plugin["direct_handoff_stages"] == 0, "the direct hand-off is on by default"
    # The first stage's update with the last stage's tokens is compiled before serving.
    assert "_post_update_kernel" not in plugin["jit_compiles"], plugin["jit_compiles"]
    assert returncode == 0, console


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise", "eager"])
def test_direct_hand_off_tokens_equal_stock(mode, tmp_path, random_model):
    """With VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF=1 both stages pass tensors without
    per-step metadata, and the greedy tokens still equal stock's."""
    plugin, _, console, returncode = _batch_bench(tmp_path, random_model, "plugin-direct", mode)
    assert plugin["direct_handoff_stages"] == 2, "a stage kept vLLM's hand-off"
    assert returncode == 0, console


def test_structured_outputs_parse_and_match_their_schema(tmp_path):
    from benchmarks.tools.serve_checks import main

    code = main(["structured", "--out", str(tmp_path), "--pp", "2", "--port", "8310"])
    report = json.loads((tmp_path / "structured-plugin-pp2.json").read_text())
    assert code == 0, {k: report.get(k) for k in
                       ("error", "problems", "grammar_rejections", "plugin_loaded_lines",
                        "shutdown_clean", "requests")}


@pytest.mark.usefixtures("test_plugins")
@pytest.mark.parametrize("stage", ["first", "last"])
def test_a_stage_fault_stops_the_server_promptly_leaving_nothing(stage, tmp_path):
    from benchmarks.tools.serve_checks import main

    code = main(["fault", "--out", str(tmp_path), "--runner", "plugin", "--stage", stage,
                 "--port", "8320"])
    report = json.loads((tmp_path / f"fault-plugin-{stage}-mp.json").read_text())
    assert code == 0, report
    assert report["stage_stop_in_log"], "the plugin did not stop the failed stage's worker"


@pytest.mark.usefixtures("test_plugins")
@pytest.mark.parametrize("stage", ["first", "last"])
def test_a_stage_fault_under_ray_stops_the_server_promptly_leaving_nothing(stage, tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (benchmarks/install_ray.sh)")
    from benchmarks.tools.serve_checks import main

    code = main(["fault", "--out", str(tmp_path), "--runner", "plugin", "--stage", stage,
                 "--ray", "--port", "8325"])
    report = json.loads((tmp_path / f"fault-plugin-{stage}-ray.json").read_text())
    assert code == 0, report
    assert report["stage_stop_in_log"], "the plugin did not stop the failed stage's worker"


def test_a_short_soak_serves_cleanly_with_every_token_on_the_models_top_choice(tmp_path):
    """The plugin's defaults and two stock servers under streamed, cancelled and
    concurrent requests, PIECEWISE. The token check judges: the defaults decode on
    another cadence than stock, so batches, and near-ties, differ by design (the
    shares are reported; soaks with ``--plugin-runner plugin-cadence`` are judged
    by them). The full soaks are committed."""
    from benchmarks.tools.soak import main

    code = main(["--out", str(tmp_path), "--modes", "piecewise", "--requests", "200",
                 "--concurrency", "64", "--token-check", "--port", "8330"])
    [result] = json.loads((tmp_path / "soak.json").read_text())
    assert result["token_check"]["problems"] == [], result["token_check"]
    assert code == 0, (result.get("share_rule"), result.get("problems"))


def test_lora_adapters_at_high_memory_use_serve_cleanly_with_their_graphs_in_budget(tmp_path):
    """Three LoRA adapters served beside the base model at gpu_memory_utilization
    0.95, the short soak's load with the sampling mix: every server starts, serves
    without error and shuts down cleanly; where the plugin sizes its graphs' memory
    (vLLM 0.26-0.28), no stage's capture takes more than it reserved (the soak fails
    the run otherwise); base-model tokens are on the model's top choice."""
    from benchmarks.tools.soak import main

    code = main(["--out", str(tmp_path), "--modes", "full_and_piecewise", "--lora", "3",
                 "--gpu-memory-utilization", "0.95", "--sampling-mix", "--requests", "200",
                 "--concurrency", "64", "--token-check", "--port", "8335"])
    [result] = json.loads((tmp_path / "soak.json").read_text())
    assert result["lora"] == 3
    assert result["token_check"]["problems"] == [], result["token_check"]
    assert code == 0, result.get("problems")


@pytest.mark.usefixtures("test_plugins")
def test_bad_start_ups_are_refused_naming_the_setting_and_leave_nothing(tmp_path):
    """Bad settings, and models whose stages disagree on the tensors they exchange."""
    from benchmarks.tools.soak import main

    code = main(["--out", str(tmp_path), "--modes", "", "--refusals", "--port", "8340"])
    results = json.loads((tmp_path / "soak.json").read_text())
    assert len(results) == 5
    assert code == 0, [r for r in results if not r["passed"]]


def _speculative_config(method: str, tmp_path) -> dict:
    """A speculative config for the random 0.6B shape: ngram, or EAGLE3 with a random draft."""
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3,
                "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    from vllm_pp_cudagraph.bench.draft_model import write_eagle3_draft

    draft = write_eagle3_draft(tmp_path / "draft")
    return {"method": method, "model": str(draft), "num_speculative_tokens": 3}


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_speculative_decoding_serves_with_the_tokens_of_a_stock_engine(method, tmp_path,
                                                                        random_model):
    """With a speculative method the plugin's engine starts on every stage and gives
    the greedy tokens of a stock engine. Two stock engines run, before and after
    it: stock's own tokens can change from engine to engine with drafts (EAGLE3 at
    PP=2 on vLLM 0.33: 17 of 64 requests), so the plugin must match one of them."""
    spec = _speculative_config(method, tmp_path)
    out = tmp_path / "bench"
    modes = "stock:full_and_piecewise,plugin:full_and_piecewise,stock:full_and_piecewise"
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_pp_cudagraph.cli", "bench", "--workload", "batch",
         "--model", str(random_model), "--modes", modes, "--prompts", "64",
         "--output-len", "64", "--repeat", "0", "--timeout", "600",
         "--speculative-config", json.dumps(spec), "--out", str(out)],
        capture_output=True, text=True, timeout=2400,
    )
    console = proc.stdout[-4000:] + proc.stderr[-2000:]
    runs = json.loads((out / "bench.json").read_text())["runs"] \
        if (out / "bench.json").exists() else []
    assert [r["spec"]["runner"] for r in runs] == ["stock", "plugin", "stock"], console
    first, plugin, second = runs
    for run in runs:
        assert run.get("digest"), f"{run['spec']['runner']} failed to serve: {console}"
        assert run["spec"]["speculative_config"]["method"] == method
        assert run["spec_decode"] and run["spec_decode"]["draft_tokens"] > 0, run["spec_decode"]
    assert plugin["plugin_stages"] == 2, "a stage ran without the plugin's runner"
    stock_sets = (first["request_digests"], second["request_digests"])
    differ = [sum(a != b for a, b in zip(s, plugin["request_digests"])) for s in stock_sets]
    stock_vs_stock = sum(a != b for a, b in zip(*stock_sets))
    print(f"{method}: plugin differs from the stock engines in {differ} of "
          f"{len(plugin['request_digests'])} requests, stock from stock in {stock_vs_stock}; "
          f"acceptance plugin {plugin['spec_decode']['acceptance_rate']}, stock "
          f"{first['spec_decode']['acceptance_rate']} / {second['spec_decode']['acceptance_rate']}")
    assert 0 in differ, (f"the plugin's tokens match neither stock engine ({differ} requests "
                         f"differ; the stock engines differ from each other in {stock_vs_stock})")
