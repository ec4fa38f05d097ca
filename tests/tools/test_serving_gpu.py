"""GPU checks of the plugin behind ``vllm serve``, driven by ``serve_checks`` and ``soak``:
structured outputs, a stage failing mid-serving, a short soak, LoRA adapters and the
start-up refusals. Skipped without 2 CUDA devices, as the checks in ``tests/e2e``."""

from __future__ import annotations

import json

import pytest
from e2e.conftest import require_gpus

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("two_gpus")]

#: The test-only vLLM plugins in tests/e2e/soak_plugins, by entry-point name.
TEST_PLUGINS = ("pp_e2e_models",)

#: vLLM's top-k/top-p Triton kernels (0.33), by name prefix.
SAMPLER_KERNELS = ("_topk_topp", "_topp_sb_")


def sampler_kernels_launched(server: dict) -> set[str]:
    """The sampler's top-k/top-p kernels that ``server`` (a soak run) launched while serving."""
    return {e["kernel"] for e in server["jit_compiles"] if e["kernel"].startswith(SAMPLER_KERNELS)}


@pytest.fixture
def two_gpus() -> None:
    """Skip unless 2 CUDA devices are visible: every check runs PP=2, one GPU per stage
    (or both stages on one, with the shared-GPU shim loaded)."""
    require_gpus(2)


@pytest.fixture
def test_plugins() -> None:
    """Fail, naming the install command, where the soak's test plugins are missing."""
    from benchmarks.tools.soak import missing_test_plugin

    missing = [why for name in TEST_PLUGINS if (why := missing_test_plugin(name))]
    if missing:
        pytest.fail("; ".join(missing) + " (the GPU checks' test-only vLLM plugins)")


def test_structured_outputs_parse_and_match_their_schema(tmp_path):
    from benchmarks.tools.serve_checks import main

    code = main(["structured", "--out", str(tmp_path), "--pp", "2", "--port", "8310"])
    report = json.loads((tmp_path / "structured-plugin-pp2.json").read_text())
    assert code == 0, {k: report.get(k) for k in
                       ("error", "problems", "grammar_rejections", "plugin_stages",
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
    the run otherwise); base-model tokens are on the model's top choice; and while the
    plugin's server sampled the mix it launched none of the sampler's top-k/top-p kernels
    for the first time where stock's did (the plugin has vLLM's warm-up compile them)."""
    from benchmarks.tools.soak import main

    code = main(["--out", str(tmp_path), "--modes", "full_and_piecewise", "--lora", "3",
                 "--gpu-memory-utilization", "0.95", "--sampling-mix", "--requests", "200",
                 "--concurrency", "64", "--token-check", "--port", "8335"])
    [result] = json.loads((tmp_path / "soak.json").read_text())
    assert result["lora"] == 3
    assert result["token_check"]["problems"] == [], result["token_check"]
    # vLLM's monitor reports a kernel's first launch in each server process, from the
    # Triton cache or compiled: stock's servers, which warm none of these up, show that
    # the load reached them.
    assert sampler_kernels_launched(result["stock_a"]) | sampler_kernels_launched(
        result["stock_b"]), "stock never masked top-k/top-p with vLLM's kernels here"
    assert not sampler_kernels_launched(result["plugin"]), result["plugin"]["jit_compiles"]
    assert code == 0, result.get("problems")


@pytest.mark.usefixtures("test_plugins")
def test_bad_start_ups_are_refused_naming_the_setting_and_leave_nothing(tmp_path):
    """Bad settings, and models whose stages disagree on the tensors they exchange."""
    from benchmarks.tools.soak import main

    code = main(["--out", str(tmp_path), "--modes", "", "--refusals", "--port", "8340"])
    results = json.loads((tmp_path / "soak.json").read_text())
    assert len(results) == 5
    assert code == 0, [r for r in results if not r["passed"]]
