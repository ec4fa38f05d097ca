"""The engines the plugin stands aside for: speculative methods and KV connectors it
has not been proven with on the installed vLLM."""

from __future__ import annotations

import typing

import pytest
import torch
from _scheduler import pp_engine_config
from vllm.config import speculative as vllm_speculative

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.commands.cli import proven_table
from vllm_pp_cudagraph.shared import support
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts
from vllm_pp_cudagraph.worker import model_runner
from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner, build_runner


def facts(method=None, connector=None, pp=2, async_scheduling=True, layers=28) -> EngineFacts:
    """An engine's facts as its plan reads them."""
    return EngineFacts(pp, {}, 8, num_layers=layers, async_scheduling=async_scheduling,
                       speculative=method, kv_connector=connector)


def unproven_reason(engine: EngineFacts, allow_unproven: bool = False) -> str | None:
    return support.unproven_reason(engine.speculative, engine.kv_connector, allow_unproven)


def known_failure(engine: EngineFacts) -> str | None:
    return support.known_failure(engine.pp, engine.speculative, engine.async_scheduling,
                                 engine.num_layers)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    return str(write_model_dir(tmp_path_factory.mktemp("model"), tokenizer=False))


def vllms_speculative_methods() -> list[str]:
    """Every method this vLLM's SpeculativeConfig accepts, nested Literals flattened."""
    def flat(tp):
        for arg in typing.get_args(tp):
            yield from flat(arg) if typing.get_args(arg) else [arg]
    return sorted(set(flat(vllm_speculative.SpeculativeMethod)))


RELEASE = vllm_surface.parse_release(vllm_surface.installed_versions().vllm)
HERE = f"{RELEASE[0]}.{RELEASE[1]}"

#: The refusal's own message (model_runner.check_refusal), so that no other error passes for it.
REFUSES = r"^vllm-pp-cudagraph refuses this engine: "


@pytest.fixture
def refused_before_vllms_runner(monkeypatch):
    """Building vLLM's runner past a refusal fails the test as such: on CPU the runner
    fails first for its own reasons ('Expected a cuda device'), which is no refusal."""
    def built(self, *args, **kwargs):
        pytest.fail("vLLM's runner was built for an engine the plugin must refuse")

    monkeypatch.setattr(model_runner.GPUModelRunner, "__init__", built)


def test_no_speculation_and_no_connector_run_with_the_plugin():
    assert unproven_reason(facts()) is None


@pytest.mark.parametrize("method", vllms_speculative_methods())
def test_each_speculative_method_vllm_offers_engages_only_where_proven(method):
    reason = unproven_reason(facts(method=method))
    proven = support.PROVEN_SPECULATIVE.get(method)
    if proven is not None and HERE in proven.releases:
        assert reason is None
    else:
        assert reason is not None and repr(method) in reason
    assert unproven_reason(facts(method=method), allow_unproven=True) is None


@pytest.mark.parametrize("connector", ["SharedStorageConnector", "NixlConnector",
                                       "OffloadingConnector", "LMCacheConnectorV1"])
def test_every_kv_connector_stands_aside_until_proven(connector):
    reason = unproven_reason(facts(connector=connector))
    assert reason == f"KV connector {connector!r} is not yet run on a GPU with the plugin"


def test_a_proven_method_on_another_release_stands_aside_naming_both(monkeypatch):
    monkeypatch.setitem(support.PROVEN_SPECULATIVE, "ngram",
                        support.Proven(("0.1",), "elsewhere"))
    reason = unproven_reason(facts(method="ngram"))
    assert reason == f"speculative method 'ngram' is proven on vLLM 0.1 only, not {HERE}"


def test_the_runner_factory_builds_vllms_own_where_it_stands_aside(monkeypatch, model_dir,
                                                                   pp_group):
    built = []

    def stock_init(self, vllm_config, device):
        built.append((vllm_config, device))

    monkeypatch.setattr(model_runner.GPUModelRunner, "__init__", stock_init)
    monkeypatch.delenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", raising=False)
    config = pp_engine_config(model_dir, connector="SharedStorageConnector")
    runner = build_runner(config, torch.device("cpu"))
    assert type(runner) is model_runner.GPUModelRunner and built == [(config, torch.device("cpu"))]


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_speculation_under_pp_without_async_scheduling_is_refused_where_stock_fails(
        method, monkeypatch, model_dir, refused_before_vllms_runner):
    """Stock vLLM 0.33 dies on the first step of such an engine: the plugin's runner
    refuses it at start, naming the setting, whatever the opt-in says."""
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", "1")
    monkeypatch.setitem(support.SPECULATIVE_SYNC_PP_FAILS, HERE, "it fails")
    refused = pp_engine_config(model_dir, speculative=method, async_scheduling=False)
    for build in (build_runner, PPCudaGraphModelRunner):
        with pytest.raises(support.KnownStockFailureError,
                           match=REFUSES + ".*async scheduling back on"):
            build(refused, torch.device("cpu"))
    for fine in (facts(method=method), facts(method=method, async_scheduling=None),
                 facts(async_scheduling=False),
                 facts(method=method, async_scheduling=False, pp=1)):
        assert known_failure(fine) is None
    monkeypatch.delitem(support.SPECULATIVE_SYNC_PP_FAILS, HERE)
    assert known_failure(facts(method=method, async_scheduling=False)) is None


@pytest.mark.parametrize("pp, partition, clash", [
    (2, None, 14), (2, "13,15", 15), (2, "15,13", None), (4, None, None),
    (4, "4,4,4,16", 16), (3, "10,10,8", None)])
def test_an_eagle_draft_is_refused_where_its_layer_name_is_the_last_stages_own(
        pp, partition, clash, monkeypatch, model_dir, refused_before_vllms_runner):
    """Stock vLLM 0.33 names an EAGLE-1 draft's layer after the last stage's layer
    count: where the stage holds that index, loading fails ('Duplicate layer name'). The
    plugin refuses exactly those engines, naming the layer, whatever the opt-in says."""
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", "1")
    monkeypatch.setitem(support.EAGLE_DRAFT_NAME_CLASH, HERE, "it fails")
    if partition:
        monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", partition)
    else:
        monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    engine = facts(method="eagle", pp=pp)
    reason = known_failure(engine)
    if clash is None:
        assert reason is None
    else:
        assert f"(here model.layers.{clash})" in reason and "EAGLE3" in reason
        with pytest.raises(support.KnownStockFailureError, match=REFUSES + ".*EAGLE draft"):
            build_runner(pp_engine_config(model_dir, pp, speculative="eagle"),
                         torch.device("cpu"))
    assert known_failure(facts(method="eagle3", pp=pp)) is None
    monkeypatch.delitem(support.EAGLE_DRAFT_NAME_CLASH, HERE)
    assert known_failure(engine) is None


def test_without_a_pipeline_the_plugin_stands_aside_whatever_the_settings(monkeypatch,
                                                                         model_dir, pp_group):
    assert "PP=1" in support.no_pipeline_reason(1)
    monkeypatch.setattr(model_runner.GPUModelRunner, "__init__", lambda *a: None)
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", "1")
    runner = build_runner(pp_engine_config(model_dir, pp=1), "cpu")
    assert type(runner) is model_runner.GPUModelRunner


def test_the_opt_in_keeps_the_plugins_runner(monkeypatch, model_dir):
    monkeypatch.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", "1")
    monkeypatch.setattr(PPCudaGraphModelRunner, "__init__",
                        lambda self, config, device, plan: None)
    runner = build_runner(pp_engine_config(model_dir, connector="SharedStorageConnector"), "cpu")
    assert type(runner) is PPCudaGraphModelRunner


def test_check_lists_each_proven_feature_and_what_stands_aside():
    lines = proven_table.table_lines()
    for kind, table in (("speculative method", support.PROVEN_SPECULATIVE),
                        ("KV connector", support.PROVEN_CONNECTORS)):
        for name, proven in table.items():
            state = "runs with the plugin" if HERE in proven.releases else "stands aside here"
            assert any(line.startswith(f"{kind} {name}: {state}") for line in lines)
        assert any(line.startswith(f"{kind}: every other one stands aside") for line in lines)


def test_a_proven_connector_runs_with_the_plugin_only_on_its_releases():
    proven = support.PROVEN_CONNECTORS["ExampleConnector"]
    reason = unproven_reason(facts(connector="ExampleConnector"))
    if HERE in proven.releases:
        assert reason is None
    else:
        assert reason == (f"KV connector 'ExampleConnector' is proven on vLLM "
                          f"{', '.join(proven.releases)} only, not {HERE}")


@pytest.mark.parametrize("version, expected", [
    ("0.33.0", "GPU-proven"),
    ("0.29.0", "never run on a GPU with the plugin (CPU suite only)")])
def test_check_says_whether_the_release_ran_on_a_gpu(version, expected):
    assert proven_table.gpu_evidence(version).startswith(expected)


def test_check_lists_the_layouts_proven_on_this_release():
    lines = proven_table.table_lines()
    layouts = [line for line in lines if line.startswith("layout: ")]
    proven = support.PROVEN_LAYOUTS.get(HERE)
    if proven:
        assert [f"layout: {p}" for p in proven] == layouts[:len(proven)]
    else:
        assert layouts[0] == f"layout: none run on a GPU with the plugin on vLLM {HERE}"
    assert "unproven" in layouts[-1]


def test_check_says_which_backends_keep_the_kv_write_in_graphs_and_what_a_capture_failure_does():
    lines = proven_table.table_lines()
    (backends,) = [line for line in lines if line.startswith("attention backend: ")]
    for name in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"):
        assert name in backends
    (capture,) = [line for line in lines if line.startswith("CUDA-graph capture failing")]
    assert "which stage" in capture and "enforce_eager=True" in capture


@pytest.mark.parametrize("vllm_version, torch_version, says", [
    ("0.33.0", "2.11.0+cu130", "the torch of the GPU runs on vLLM 0.33"),
    ("0.33.0", "2.14.0", "GPU runs on vLLM 0.33 used torch 2.11; with 2.14 only the CPU suite"),
    ("0.30.0", "2.13.0", ""),
])
def test_check_says_whether_the_gpu_runs_used_this_torch(vllm_version, torch_version, says):
    """vLLM 0.33's pin brings torch 2.14, while every GPU run used 2.11."""
    said = proven_table.torch_evidence(vllm_version, torch_version)
    assert said.startswith(says) if says else said == ""


def test_the_runner_built_directly_for_an_engine_the_plugin_leaves_to_vllm_refuses(
        monkeypatch, model_dir, refused_before_vllms_runner):
    """A user who builds PPCudaGraphModelRunner by hand gets the plan's stand-aside as a
    clear error naming build_runner, not the plugin's runner on an engine it does not
    cover."""
    from vllm_pp_cudagraph.worker.model_runner import RunnerStandsAsideError

    monkeypatch.delenv("VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN", raising=False)
    aside = pp_engine_config(model_dir, connector="SharedStorageConnector")
    with pytest.raises(RunnerStandsAsideError,
                       match=r"stands aside.*KV connector.*vllm_pp_cudagraph\.build_runner"):
        PPCudaGraphModelRunner(aside, torch.device("cpu"))
