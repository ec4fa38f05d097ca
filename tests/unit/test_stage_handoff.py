"""Direct hand-offs: intermediate tensors passed between stages without per-step metadata.

The exchange runs between real processes over gloo with vLLM's own process
groups (tests/unit/_pipeline_processes.py), as the worker calls it.
"""

from __future__ import annotations

import pytest

from vllm_pp_cudagraph import patches, stage_handoff
from vllm_pp_cudagraph.settings import PPCudaGraphSettings


@pytest.mark.parametrize("pp_size, tp_size", [(2, 1), (2, 2), (3, 1)])
def test_steps_of_every_size_arrive_in_the_input_buffers_unchanged(pp_size, tp_size):
    from _pipeline_processes import DIRECT_STEPS, run_stages

    reports = run_stages("direct", tp_size=tp_size, pp_size=pp_size)
    assert sorted(r["stage"] for r in reports) == sorted(list(range(pp_size)) * tp_size)
    for r in reports:
        assert r["blocker"] is None
        assert r["blocker_after_undo"] == "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF is off"
        if r["stage"] < pp_size - 1:  # vLLM's worker waits handles[1:] (0.33) or all (0.26)
            assert r["first_handle_done"] is True
        if r["stage"] == 0:
            continue
        assert len(r["steps"]) == len(DIRECT_STEPS)
        for row in r["steps"]:  # a middle stage received, then sent on what it received
            assert row == {"pending_before_receive": True, "nothing_to_wait": True,
                           "equal": True, "in_buffers": True}
        if r["stage"] == 1:
            assert r["vllm_equal"] is True  # vLLM's hand-off on the group once disabled


def test_only_groups_the_runner_enabled_skip_vllms_hand_off(monkeypatch):
    calls = []
    monkeypatch.setattr(stage_handoff, "defer_receive", lambda group, **kw: ("direct", group))
    receive = stage_handoff.wrap_receive(lambda group, **kw: calls.append(group) or "vllm")

    class Group:
        world_size = 2

    enabled, other = Group(), Group()
    stage_handoff.enable(enabled)
    try:
        assert receive(other, all_gather_group=None) == "vllm"
        assert receive(enabled, all_gather_group=None) == ("direct", enabled)
    finally:
        stage_handoff.disable(enabled)
    assert receive(enabled) == "vllm"
    assert calls == [other, enabled]


def test_the_patch_wraps_vllms_methods_and_undo_restores_them():
    from vllm.distributed.parallel_state import GroupCoordinator

    original = (GroupCoordinator.isend_tensor_dict, GroupCoordinator.irecv_tensor_dict)
    undo = patches.apply_patch("direct-handoff", PPCudaGraphSettings(direct_handoff=True))
    assert GroupCoordinator.isend_tensor_dict.__wrapped__ is original[0]
    assert GroupCoordinator.irecv_tensor_dict.__wrapped__ is original[1]
    undo()
    assert (GroupCoordinator.isend_tensor_dict, GroupCoordinator.irecv_tensor_dict) == original
    assert stage_handoff.direct_handoff_blocker(object(), None) == (
        "VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF is off"
    )


def test_speculative_decoding_keeps_vllms_hand_off():
    undo = patches.apply_patch("direct-handoff", PPCudaGraphSettings(direct_handoff=True))
    try:
        class Group:
            world_size = 2

        assert stage_handoff.direct_handoff_blocker(Group(), None) is None
        assert "speculative decoding" in stage_handoff.direct_handoff_blocker(Group(), object())
    finally:
        undo()


def test_the_patch_is_off_unless_asked_for():
    assert patches.apply_patch("direct-handoff", PPCudaGraphSettings()) is None
