"""Direct hand-offs: intermediate tensors passed between stages without per-step metadata.

The exchange runs between real processes over gloo with vLLM's own process
groups (tests/unit/_pipeline_processes.py), as the worker calls it.
"""

from __future__ import annotations

import pytest

from vllm_pp_cudagraph import patches
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings
from vllm_pp_cudagraph.worker.pipeline import stage_handoff


@pytest.mark.parametrize("pp_size, tp_size", [(2, 1), (2, 2), (3, 1)])
def test_steps_of_every_size_arrive_in_the_input_buffers_unchanged(pp_size, tp_size):
    from _pipeline_processes import DIRECT_STEPS, run_stages

    reports = run_stages("direct", tp_size=tp_size, pp_size=pp_size)
    assert sorted(r["stage"] for r in reports) == sorted(list(range(pp_size)) * tp_size)
    for r in reports:
        assert r["blocker"] is None
        assert r["vllm_methods_after_undo"] is True
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


def test_only_the_enabled_group_skips_vllms_hand_off_and_undo_gives_it_back(monkeypatch):
    from vllm.distributed.parallel_state import GroupCoordinator

    monkeypatch.setattr(stage_handoff, "defer_receive", lambda group, **kw: ("direct", group))
    enabled, other = (GroupCoordinator.__new__(GroupCoordinator) for _ in range(2))
    undo = stage_handoff.enable(enabled)
    assert enabled.irecv_tensor_dict(all_gather_group=None) == ("direct", enabled)
    # Another group, and the class every group is built from, keep vLLM's methods.
    assert other.irecv_tensor_dict.__func__ is GroupCoordinator.irecv_tensor_dict
    assert other.isend_tensor_dict.__func__ is GroupCoordinator.isend_tensor_dict
    undo()
    assert enabled.irecv_tensor_dict.__func__ is GroupCoordinator.irecv_tensor_dict
    assert enabled.isend_tensor_dict.__func__ is GroupCoordinator.isend_tensor_dict


def test_a_group_with_its_own_communicator_keeps_vllms_hand_off():
    class Group:
        use_cpu_custom_send_recv = False

    assert stage_handoff.group_blocker(Group()) is None
    Group.use_cpu_custom_send_recv = True
    assert "its own communicator" in stage_handoff.group_blocker(Group())


def test_the_direct_hand_off_is_no_start_up_patch():
    # The runner applies it to its own group; apply_all changes no vLLM class for it.
    patch = next(p for p in patches.PATCHES if p.name == "direct-handoff")
    assert patch.apply is None and patch.scope == "vllm_pp_cudagraph.worker.pipeline.stage_handoff.enable"
    assert patches.apply_patch("direct-handoff", PPCudaGraphSettings(direct_handoff=True)) is None


@pytest.mark.parametrize("direct_per_stage", [[True, False], [False, False, True]])
def test_stages_that_disagree_on_the_direct_hand_off_stop_start_up(direct_per_stage):
    """One side would wait for metadata the other never sends: a hang, refused instead."""
    with pytest.raises(stage_handoff.HandoffDisagreementError,
                       match="VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF alike"):
        stage_handoff.check_stages_agree(direct_per_stage)


@pytest.mark.parametrize("direct_per_stage", [[True, True], [False, False, False]])
def test_stages_that_agree_start(direct_per_stage):
    stage_handoff.check_stages_agree(direct_per_stage)
