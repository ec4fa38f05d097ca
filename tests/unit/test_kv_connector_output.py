"""A KV connector's per-step output leaves each stage's step exactly as vLLM made it.

vLLM (0.24+) returns every stage's connector output in its ``ModelRunnerOutput``
(a non-last stage in an otherwise empty one) and the scheduler aggregates them;
the plugin's step must neither drop nor repeat it, on a first or a last stage.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from vllm.sequence import IntermediateTensors
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.worker.gpu.model_runner import GPUModelRunner

from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner


def stage(last: bool) -> PPCudaGraphModelRunner:
    runner = PPCudaGraphModelRunner.__new__(PPCudaGraphModelRunner)
    runner._init_stage_state()
    buffers = {k: torch.zeros(8, 4) for k in ("hidden_states", "residual")}
    runner.__dict__.update(use_pp=True, pp_stage=int(last), tp_size=1, is_last_pp_rank=last,
                           intermediate_tensors=IntermediateTensors(buffers) if last else None)
    return runner


@pytest.mark.parametrize("last", [False, True])
def test_the_connector_output_of_a_step_is_returned_once_unchanged(last, monkeypatch):
    produced = KVConnectorOutput(finished_sending={"req-a"}, finished_recving={"req-b"},
                                 invalid_block_ids={7})
    output = ModelRunnerOutput(req_ids=["req-a"] if last else [], req_id_to_index={},
                               kv_connector_output=produced)
    expected = copy.deepcopy(produced)
    monkeypatch.setattr(GPUModelRunner, "execute_model", lambda self, *a, **k: output)
    scheduler_output = SimpleNamespace(total_num_scheduled_tokens=4,
                                       scheduled_cached_reqs=SimpleNamespace(req_ids=["req-a"]))
    received = IntermediateTensors({k: torch.ones(4, 4) for k in ("hidden_states", "residual")})
    returned = stage(last).execute_model(scheduler_output, received if last else None)
    assert returned is output
    assert returned.kv_connector_output is produced and produced == expected
