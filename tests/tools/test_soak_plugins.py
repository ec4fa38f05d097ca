"""The serving soak's test-only vLLM plugins, in ``tests/e2e/soak_plugins``.

``pp_e2e_models`` registers models for the stage-mismatch refusals; these checks
make sure that what it registers really is a mismatch the plugin's start-up
check reports with the text the soak looks for.
"""

from __future__ import annotations

import importlib
import os
import tomllib
from pathlib import Path

import pytest
import torch
from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory
from vllm.v1.core.sched.async_scheduler import AsyncScheduler

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings
from vllm_pp_cudagraph.worker.pipeline.stage_inputs import (
    StageInputMismatchError,
    check_handoff_schemas,
    schema_of,
)

PACKAGE_DIR = Path(__file__).parents[1] / "e2e" / "soak_plugins"


@pytest.fixture
def e2e_models(monkeypatch):
    monkeypatch.syspath_prepend(str(PACKAGE_DIR))
    import pp_e2e_models

    return pp_e2e_models


def test_entry_points_name_the_register_functions(e2e_models):
    project = tomllib.loads((PACKAGE_DIR / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"pp_e2e_models": "pp_e2e_models:register"}


def test_register_adds_the_architecture_to_vllms_registry(e2e_models):
    from vllm import ModelRegistry

    try:
        e2e_models.register()
        archs = ModelRegistry.get_supported_archs()
        assert e2e_models.STAGE_MISMATCH_ARCH in archs
        assert e2e_models.UNDECLARED_OUTPUT_ARCH in archs
    finally:
        ModelRegistry.models.pop(e2e_models.STAGE_MISMATCH_ARCH, None)
        ModelRegistry.models.pop(e2e_models.UNDECLARED_OUTPUT_ARCH, None)


def test_last_stage_expects_a_key_the_first_never_sends(e2e_models):
    from pp_e2e_models.stage_mismatch import with_undeclared_key

    declared = make_empty_intermediate_tensors_factory(["hidden_states", "residual"], 16)
    last_stage = with_undeclared_key(declared)
    sent = schema_of(declared(4, torch.bfloat16, torch.device("cpu")).tensors)
    expected = schema_of(last_stage(4, torch.bfloat16, torch.device("cpu")).tensors)
    assert expected["aux"] == expected["hidden_states"]
    with pytest.raises(StageInputMismatchError, match=r"missing keys \['aux'\]"):
        check_handoff_schemas([sent, None], [None, expected])


def test_forward_output_carries_a_key_the_next_stage_never_declared(e2e_models):
    from pp_e2e_models.stage_mismatch import with_undeclared_output
    from vllm.sequence import IntermediateTensors

    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import PRODUCED

    declared = make_empty_intermediate_tensors_factory(["hidden_states", "residual"], 16)
    buffers = schema_of(declared(4, torch.bfloat16, torch.device("cpu")).tensors)
    output = with_undeclared_output(declared(4, torch.bfloat16, torch.device("cpu")))
    assert isinstance(output, IntermediateTensors)
    with pytest.raises(StageInputMismatchError, match=r"unexpected keys \['aux'\]") as err:
        check_handoff_schemas([schema_of(output.tensors), None], [None, buffers], PRODUCED)
    assert "returned by the model's forward" in str(err.value)
    hidden = torch.ones(4, 16)  # the last stage returns plain hidden states: left alone
    assert with_undeclared_output(hidden) is hidden



def test_the_fault_model_fails_the_stage_it_is_asked_to_and_refuses_others(e2e_models, monkeypatch):
    stage_fault = importlib.import_module("pp_e2e_models.stage_fault")
    # A two-stage pipeline: stage 0 is first, stage 1 is last.
    stages = [(True, False), (False, True)]
    for asked, failing in (("first", [True, False]), ("last", [False, True])):
        monkeypatch.setenv("PP_E2E_FAULT_STAGE", asked)
        assert [stage_fault.faults_here(stage_fault.fault_stage(), *s) for s in stages] == failing
    monkeypatch.delenv("PP_E2E_FAULT_STAGE")
    assert stage_fault.fault_stage() == "first"
    monkeypatch.setenv("PP_E2E_FAULT_STAGE", "middle")
    with pytest.raises(ValueError, match="PP_E2E_FAULT_STAGE"):
        stage_fault.fault_stage()
