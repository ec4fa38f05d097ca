"""The check of what a pipeline stage receives against its persistent buffers."""

from __future__ import annotations

import pytest
import torch
from vllm.sequence import IntermediateTensors
from vllm.v1.worker.gpu_worker import AsyncIntermediateTensors

from vllm_pp_cudagraph.worker.pipeline.stage_inputs import (
    StageInputMismatchError,
    check_padding_agreement,
    check_stage_inputs,
)

HIDDEN = 16
BUFFERS = {
    "hidden_states": torch.zeros(64, HIDDEN, dtype=torch.bfloat16),
    "residual": torch.zeros(64, HIDDEN, dtype=torch.bfloat16),
}


def received(n: int, **overrides) -> IntermediateTensors:
    tensors = {k: torch.ones(n, HIDDEN, dtype=torch.bfloat16) for k in BUFFERS}
    tensors.update(overrides)
    return IntermediateTensors({k: v for k, v in tensors.items() if v is not None})


def test_matching_tensors_pass_and_report_token_count():
    assert check_stage_inputs(BUFFERS, received(8), min_tokens=5, stage=1) == 8


def test_missing_key_is_named():
    with pytest.raises(StageInputMismatchError, match=r"missing keys \['residual'\]"):
        check_stage_inputs(BUFFERS, received(8, residual=None), 8, stage=1)


def test_extra_key_is_named_instead_of_silently_dropped():
    extra = torch.ones(8, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(StageInputMismatchError, match=r"unexpected keys \['aux'\]"):
        check_stage_inputs(BUFFERS, received(8, aux=extra), 8, stage=1)


def test_dtype_mismatch_is_named():
    bad = torch.ones(8, HIDDEN, dtype=torch.float32)
    with pytest.raises(StageInputMismatchError, match="'residual' has dtype torch.float32"):
        check_stage_inputs(BUFFERS, received(8, residual=bad), 8, stage=1)


def test_hidden_size_mismatch_is_named():
    bad = torch.ones(8, HIDDEN * 2, dtype=torch.bfloat16)
    with pytest.raises(StageInputMismatchError, match=r"'hidden_states' has shape \(8, 32\)"):
        check_stage_inputs(BUFFERS, received(8, hidden_states=bad), 8, stage=1)


def test_every_problem_is_reported_at_once():
    bad = torch.ones(8, HIDDEN, dtype=torch.float16)
    extra = torch.ones(8, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(StageInputMismatchError) as err:
        check_stage_inputs(BUFFERS, received(8, residual=None, hidden_states=bad, x=extra), 8)
    message = str(err.value)
    assert "missing keys ['residual']" in message
    assert "unexpected keys ['x']" in message
    assert "'hidden_states' has dtype torch.float16" in message


def test_fewer_tokens_than_scheduled_is_an_error():
    with pytest.raises(StageInputMismatchError, match="received 4 tokens but this step schedules 6"):
        check_stage_inputs(BUFFERS, received(4), min_tokens=6)


def test_more_tokens_than_buffer_is_an_error():
    with pytest.raises(StageInputMismatchError, match="more than the buffer's 64"):
        check_stage_inputs(BUFFERS, received(65), min_tokens=1)


def test_keys_disagreeing_on_token_count_is_an_error():
    short = torch.ones(4, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(StageInputMismatchError, match=r"disagree on the token count: \[4, 8\]"):
        check_stage_inputs(BUFFERS, received(8, residual=short), 4)


class _Handle:
    waited = False

    def wait(self):
        type(self).waited = True


def test_async_received_tensors_are_checked_without_waiting_for_the_transfer():
    tensors = dict(received(8).tensors)
    async_tensors = AsyncIntermediateTensors(tensors, comm_handles=[_Handle()])
    assert check_stage_inputs(BUFFERS, async_tensors, 8) == 8
    assert _Handle.waited is False
    async_tensors.tensors  # vLLM's own access waits, as before
    assert _Handle.waited is True


def test_padding_disagreement_names_both_counts():
    check_padding_agreement(16, 16, stage=1)
    with pytest.raises(StageInputMismatchError, match="expected 16 tokens .* sent 12"):
        check_padding_agreement(12, 16, stage=1)


def pending_receive(n: int, hidden: int = HIDDEN, tp_size: int = 1) -> AsyncIntermediateTensors:
    """What vLLM's irecv_tensor_dict hands over before the wait: this TP rank's
    flat share, which a post-process step all-gathers and reshapes."""
    flat = {k: torch.ones(n * hidden // tp_size, dtype=torch.bfloat16) for k in BUFFERS}

    def reshape_all():  # the all-gather over the TP group, for one process
        for k in flat:
            flat[k] = flat[k].repeat(tp_size).reshape(n, hidden)

    return AsyncIntermediateTensors(flat, comm_handles=[], comm_postprocess=[reshape_all])


def test_pending_flat_receive_is_read_by_element_count():
    pending = pending_receive(256)
    big = {k: torch.zeros(512, HIDDEN, dtype=torch.bfloat16) for k in BUFFERS}
    assert check_stage_inputs(big, pending, min_tokens=200, stage=1) == 256
    assert pending.tensors["hidden_states"].shape == (256, HIDDEN)  # vLLM's wait reshapes


def test_pending_flat_receive_with_wrong_hidden_size_is_caught():
    big = {k: torch.zeros(512, HIDDEN, dtype=torch.bfloat16) for k in BUFFERS}
    # 10 rows of hidden 20 are 200 elements: not whole rows of 16.
    with pytest.raises(StageInputMismatchError, match="not a whole number of"):
        check_stage_inputs(big, pending_receive(10, hidden=20), min_tokens=1)
    # 8 rows of 32 read as 16 rows of 16: caught by the padding agreement.
    tokens = check_stage_inputs(big, pending_receive(8, hidden=32), min_tokens=1)
    with pytest.raises(StageInputMismatchError, match="expected 8 tokens"):
        check_padding_agreement(tokens, 8, stage=1)


def test_startup_schemas_compare_dims_and_dtype_whatever_the_token_count():
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import check_handoff_schemas, schema_of

    # A forward's output of one token and a buffer of 64 describe the same hand-off.
    buffers = schema_of(BUFFERS)
    one_token = schema_of({k: v[:1] for k, v in BUFFERS.items()})
    assert one_token == buffers == {"hidden_states": ((HIDDEN,), "torch.bfloat16"),
                                    "residual": ((HIDDEN,), "torch.bfloat16")}
    check_handoff_schemas([one_token, one_token, None], [None, buffers, buffers])


def test_startup_schema_mismatch_names_the_stages_and_keys():
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import check_handoff_schemas, schema_of

    want = schema_of(BUFFERS)
    sent = schema_of({"hidden_states": torch.zeros(1, HIDDEN * 2, dtype=torch.bfloat16)})
    with pytest.raises(StageInputMismatchError) as err:
        check_handoff_schemas([want, sent, None], [None, want, want])
    message = str(err.value)
    assert "stage 1 -> stage 2" in message and "stage 0 -> stage 1" not in message
    assert "missing keys ['residual']" in message
    assert "'hidden_states' is ((32,), 'torch.bfloat16') but expected ((16,), 'torch.bfloat16')" in message


def test_startup_mismatch_names_where_the_sent_tensors_came_from():
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import (
        PRODUCED,
        check_handoff_schemas,
        schema_of,
    )

    want = schema_of(BUFFERS)
    sent = schema_of({**BUFFERS, "aux": torch.zeros(1, HIDDEN, dtype=torch.bfloat16)})
    with pytest.raises(StageInputMismatchError, match="returned by the model's forward") as err:
        check_handoff_schemas([sent, None], [None, want], PRODUCED)
    assert "unexpected keys ['aux']" in str(err.value)


def test_forward_returning_an_undeclared_key_stops_both_stages_at_startup():
    from _pipeline_processes import run_stages

    results = run_stages("handoff")
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:  # both stages raise, so neither is left waiting for the other
        assert "stage 0 -> stage 1 (tensors returned by the model's forward" in r["produced_error"]
        assert "unexpected keys ['aux']" in r["produced_error"]
        # A stage whose process lacks VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF stops them all.
        assert "disagree on the direct hand-off: on for stages [1]" in r["direct_error"]
        assert "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF" in r["direct_error"]


def test_pending_share_under_tensor_parallelism_counts_all_ranks_tokens():
    big = {k: torch.zeros(512, HIDDEN, dtype=torch.bfloat16) for k in BUFFERS}
    assert check_stage_inputs(big, pending_receive(256, tp_size=2), 1, tp_size=2) == 256
    assert check_stage_inputs(big, pending_receive(256, tp_size=4), 1, tp_size=4) == 256


AUX = "aux_hidden_states_"


def test_a_declaration_may_lack_the_slots_vllm_reserves_on_the_receiver():
    # EAGLE3 over PP: vLLM adds aux slots to the receiving stage's buffers only.
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import check_handoff_schemas, schema_of

    declared = schema_of(BUFFERS)
    buffers = schema_of({**BUFFERS, f"{AUX}0": torch.zeros(1, HIDDEN, dtype=torch.bfloat16)})
    check_handoff_schemas([declared, None], [None, buffers], reserved_prefixes=(AUX,))
    with pytest.raises(StageInputMismatchError, match=f"missing keys \\['{AUX}0'\\]"):
        check_handoff_schemas([declared, None], [None, buffers])


def test_a_forward_that_lacks_a_reserved_slot_is_still_refused():
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import (
        PRODUCED,
        check_handoff_schemas,
        schema_of,
    )

    produced = schema_of(BUFFERS)
    buffers = schema_of({**BUFFERS, f"{AUX}0": torch.zeros(1, HIDDEN, dtype=torch.bfloat16)})
    with pytest.raises(StageInputMismatchError, match=f"missing keys \\['{AUX}0'\\]"):
        check_handoff_schemas([produced, None], [None, buffers], PRODUCED, (AUX,))


def test_a_reserved_slot_of_another_shape_is_refused_even_as_declared():
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import check_handoff_schemas, schema_of

    slot = {f"{AUX}0": torch.zeros(1, HIDDEN, dtype=torch.bfloat16)}
    declared = schema_of({**BUFFERS, f"{AUX}0": torch.zeros(1, 2 * HIDDEN, dtype=torch.bfloat16)})
    with pytest.raises(StageInputMismatchError, match=f"'{AUX}0' is"):
        check_handoff_schemas([declared, None], [None, schema_of({**BUFFERS, **slot})],
                              reserved_prefixes=(AUX,))


def test_the_prefixes_vllm_reserves_are_read_from_vllm():
    from vllm_pp_cudagraph.shared import vllm_surface

    interfaces = pytest.importorskip("vllm.model_executor.models.interfaces")
    mixin = getattr(interfaces, "EagleModelMixin", None)
    if mixin is None or not hasattr(mixin, "AUX_HIDDEN_STATE_KEY"):
        assert vllm_surface.stage_reserved_key_prefixes() == ()
    else:
        assert vllm_surface.stage_reserved_key_prefixes() == (mixin.AUX_HIDDEN_STATE_KEY,)


def test_an_eagle3_target_over_three_stages_starts_and_a_lost_aux_state_is_refused():
    pytest.importorskip("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
                        reason="this vLLM has no EAGLE3 over pipeline parallelism")
    eagle3_utils = __import__("vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils",
                              fromlist=["x"])
    if not hasattr(eagle3_utils, "reserve_aux_intermediate_tensor_slots"):
        pytest.skip("this vLLM has no EAGLE3 over pipeline parallelism")
    from _pipeline_processes import run_stages

    results = run_stages("eagle3", pp_size=3)
    # vLLM's own layout: the first stage declares no aux state, the receivers
    # reserve one slot per tap before them, a middle stage relays and adds.
    assert results[0]["expects"] is None
    assert results[1]["expects"] == [f"{AUX}0", "hidden_states", "residual"]
    assert results[2]["expects"] == [f"{AUX}0", f"{AUX}1", "hidden_states", "residual"]
    assert results[1]["sends"] == results[2]["expects"]
    for r in results:  # every stage agrees, so none waits on another
        assert r["declared"] is None and r["produced"] is None
        assert "stage 1 -> stage 2 (tensors returned by the model's forward in the" in r[
            "produced_lacking"]
        assert f"missing keys ['{AUX}1']" in r["produced_lacking"]
