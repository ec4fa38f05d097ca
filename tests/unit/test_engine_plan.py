"""One engine's plan: each decision made once, from the settings and the engine's config."""

from __future__ import annotations

import pytest
from _scheduler import make_scheduler

from vllm_pp_cudagraph.shared.engine_plan import (
    LIFTING,
    PLUGIN_SCHEDULER,
    EngineFacts,
    plan_engine,
)
from vllm_pp_cudagraph.shared.settings import DecodeCadence, PPCudaGraphSettings


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """A real PP engine config (MRV2, the plugin's scheduler) and a way to reshape it."""
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    def make(pp: int = 2, speculative=None, connector=None):
        config = make_scheduler(str(write_model_dir(tmp_path / f"m{pp}", tokenizer=False)),
                                pp=pp).vllm_config
        monkeypatch.setattr(type(config), "use_v2_model_runner", property(lambda self: True))
        if pp > 1:  # as the API server names it with the plugin enabled
            config.scheduler_config.scheduler_cls = PLUGIN_SCHEDULER
        if speculative:
            monkeypatch.setattr(config, "speculative_config", type(
                "Spec", (), {"method": speculative, "num_speculative_tokens": 3})())
        if connector:
            monkeypatch.setattr(config, "kv_transfer_config",
                                type("KV", (), {"kv_connector": connector})())
        return config

    return make


def plan_config(settings: PPCudaGraphSettings, config, gpu_memory_bytes=None):
    """The plan of the engine ``config`` configures, as its processes make it."""
    return plan_engine(settings, EngineFacts.of(config), gpu_memory_bytes)


def settings(**values) -> PPCudaGraphSettings:
    return PPCudaGraphSettings(**values)


def test_a_plain_pp_engine_runs_the_plugin_with_the_asked_cadence(engine):
    plan = plan_config(settings(decode_cadence=DecodeCadence.MERGE), engine())
    assert plan.plugin_runner and plan.stand_aside is None and plan.refusal is None
    assert plan.cadence is plan.asked_cadence is DecodeCadence.MERGE
    assert plan.cadence in LIFTING
    assert not plan.direct_handoff and plan.direct_handoff_blocker is None


def test_without_a_pipeline_everything_stands_aside_at_info(engine):
    plan = plan_config(settings(direct_handoff=True, allow_unproven=True), engine(pp=1))
    assert not plan.plugin_runner and plan.no_pipeline and "PP=1" in plan.stand_aside
    assert plan.cadence is DecodeCadence.VLLM
    assert not plan.direct_handoff and plan.direct_handoff_blocker == "no pipeline parallelism"


def test_an_unproven_connector_keeps_stocks_runner_and_cadence_unless_allowed(engine):
    plan = plan_config(settings(), engine(connector="SomeConnector"))
    assert not plan.plugin_runner and not plan.no_pipeline
    assert "KV connector 'SomeConnector'" in plan.stand_aside
    assert plan.cadence is DecodeCadence.VLLM and plan.cadence not in LIFTING
    # The stock runner never hands on directly, whatever is asked.
    asked = plan_config(settings(direct_handoff=True), engine(connector="SomeConnector"))
    assert not asked.direct_handoff
    allowed = plan_config(settings(allow_unproven=True), engine(connector="SomeConnector"))
    # The runner runs; the cadence stays vLLM's wherever a connector is (decode_cadence.py).
    assert allowed.plugin_runner and allowed.cadence is DecodeCadence.VLLM


def test_speculative_decoding_keeps_vllms_hand_off(engine):
    plan = plan_config(settings(direct_handoff=True, allow_unproven=True),
                       engine(speculative="ngram"))
    assert not plan.direct_handoff and "speculative decoding" in plan.direct_handoff_blocker
    assert plan_config(settings(direct_handoff=True), engine()).direct_handoff


@pytest.mark.parametrize("scheduler", ["vllm.v1.core.sched.scheduler.Scheduler",
                                       "vllm.v1.core.sched.async_scheduler.AsyncScheduler"])
def test_a_scheduler_other_than_the_plugins_keeps_vllms_cadence(engine, scheduler):
    """vLLM's sync scheduler, or a class the user named (here vLLM's own async one): the
    engine runs vLLM's cadence, whatever the setting asks."""
    config = engine()
    config.scheduler_config.scheduler_cls = scheduler
    assert plan_config(settings(decode_cadence="merge"), config).cadence is DecodeCadence.VLLM


def test_a_known_failure_is_judged_on_the_split_the_engine_will_use(engine, monkeypatch):
    """An EAGLE-1 draft clashes with the last stage's layer names under vLLM's 14/14 on
    0.33; a split the plan chose (here 15/13, the last stage lighter) does not, though
    vLLM's variable is not set yet when the plan is made."""
    from vllm_pp_cudagraph.shared import support
    from vllm_pp_cudagraph.shared import layer_partition

    monkeypatch.setitem(support.EAGLE_DRAFT_NAME_CLASH, support.release_line(), "it fails")
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    allowed = settings(allow_unproven=True)
    assert "model.layers.14" in plan_config(allowed, engine(speculative="eagle")).refusal
    chosen = layer_partition.Decision("auto", "auto picks 15,13", (15, 13))
    monkeypatch.setattr(layer_partition, "decide", lambda *args, **kwargs: chosen)
    assert plan_config(allowed, engine(speculative="eagle")).refusal is None


def test_an_engine_vllm_runs_on_its_v1_runner_keeps_vllms_runner_and_cadence(tmp_path,
                                                                              monkeypatch):
    """VLLM_USE_V2_MODEL_RUNNER=0: vLLM builds its V1 runner, so the plan claims neither
    the plugin's runner nor its cadence."""
    from vllm.config import DeviceConfig, ModelConfig, ParallelConfig, VllmConfig

    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    config = VllmConfig(
        model_config=ModelConfig(model=str(write_model_dir(tmp_path)), skip_tokenizer_init=True,
                                 max_model_len=256),
        parallel_config=ParallelConfig(pipeline_parallel_size=2),
        device_config=DeviceConfig(device="cpu"))
    assert not config.use_v2_model_runner and config.parallel_config.pipeline_parallel_size == 2
    plan = plan_config(settings(), config)
    assert plan.stand_aside == "vLLM runs this model on its V1 runner"
    assert not plan.plugin_runner and plan.cadence is DecodeCadence.VLLM


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_speculative_decoding_keeps_vllms_cadence_under_auto(method, engine, tmp_path):
    """Its rejected drafts reach the first stages through the same ring: the cadence stays
    vLLM's even where the plugin's runner runs the engine."""
    import json

    from vllm.config import SpeculativeConfig

    from vllm_pp_cudagraph.commands.bench.draft_model import draft_config
    from vllm_pp_cudagraph.commands.bench.dummy_model import SHAPES

    config = engine()
    if method == "ngram":
        draft = {"prompt_lookup_max": 3}
    else:
        (tmp_path / "config.json").write_text(json.dumps(draft_config(SHAPES["qwen3-0.6b"])))
        draft = {"model": str(tmp_path)}
    try:
        config.speculative_config = SpeculativeConfig(
            method=method, num_speculative_tokens=3, target_model_config=config.model_config,
            target_parallel_config=config.parallel_config, **draft)
    except NotImplementedError as error:  # 0.26: drafts without SupportsPP under PP
        if method != "eagle3":
            raise
        pytest.skip(f"this vLLM refuses an {method} draft at PP=2: {error}")
    plan = plan_config(settings(allow_unproven=True), config)
    assert plan.plugin_runner and plan.asked_cadence is DecodeCadence.AUTO
    assert plan.cadence is DecodeCadence.VLLM
