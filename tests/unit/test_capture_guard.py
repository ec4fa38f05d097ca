"""No pipeline communication may run while CUDA graphs are captured."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from vllm_pp_cudagraph.worker.graphs.capture_guard import (
    CapturedCommunicationError,
    capture_guard_active,
    forbid_pipeline_communication,
)


def test_torch_calls_on_the_pp_groups_raise_during_capture_and_are_restored_after(pp_group):
    original = dist.irecv
    with forbid_pipeline_communication((pp_group,)):
        assert capture_guard_active()
        with pytest.raises(CapturedCommunicationError, match="torch.distributed.irecv"):
            dist.irecv(torch.zeros(1), src=0, group=pp_group.device_group)
        with pytest.raises(CapturedCommunicationError, match="torch.distributed.broadcast"):
            dist.broadcast(torch.zeros(1), 0, pp_group.cpu_group)
        with pytest.raises(CapturedCommunicationError, match="broadcast_object_list"):
            dist.broadcast_object_list([1], src=0, group=pp_group.cpu_group)
    assert not capture_guard_active()
    assert dist.irecv is original


def test_tensor_parallel_traffic_outside_stream_capture_passes(pp_group):
    # Custom all-reduce registers graph buffers with a TP-group broadcast when
    # capture ends; that must keep working under the guard.
    from vllm.distributed.parallel_state import get_tp_group

    tp_cpu_group = get_tp_group().cpu_group
    assert tp_cpu_group is not pp_group.cpu_group
    box = ["registered"]
    gathered = [None]
    with forbid_pipeline_communication((pp_group,)):
        dist.broadcast_object_list(box, src=0, group=tp_cpu_group)
        dist.all_gather_object(gathered, "handles", group=tp_cpu_group)
    assert box == ["registered"]
    assert gathered == ["handles"]  # world size 1: the real exchange ran


def test_any_collective_raises_while_a_stream_is_capturing(pp_group, monkeypatch):
    """A TP or default-group collective recorded into a graph replays without its peers
    (the hang of vLLM #51887): while a stream captures, every guarded call refuses."""
    from vllm.distributed.parallel_state import get_tp_group

    from vllm_pp_cudagraph.worker.graphs import capture_guard

    monkeypatch.setattr(capture_guard, "_stream_capturing", lambda: True)
    with forbid_pipeline_communication((pp_group,)):
        with pytest.raises(CapturedCommunicationError, match="broadcast_object_list"):
            dist.broadcast_object_list(["x"], src=0, group=get_tp_group().cpu_group)
        with pytest.raises(CapturedCommunicationError, match="torch.distributed.broadcast"):
            dist.broadcast(torch.zeros(1), 0)


def test_pp_group_transfers_raise_during_capture(pp_group):
    with forbid_pipeline_communication((pp_group,)):
        with pytest.raises(CapturedCommunicationError, match=r"pp.*send_tensor_dict"):
            pp_group.send_tensor_dict({"hidden_states": torch.zeros(2, 4)})
        with pytest.raises(CapturedCommunicationError, match=r"pp.*irecv_tensor_dict"):
            pp_group.irecv_tensor_dict()
        with pytest.raises(CapturedCommunicationError, match=r"pp.*barrier"):
            pp_group.barrier()
    assert "send_tensor_dict" not in vars(pp_group)  # class method visible again


def test_pp_group_works_again_after_capture(pp_group):
    from vllm_pp_cudagraph.worker.graphs.capture_guard import (
        GUARDED_GROUP_METHODS,
        GUARDED_TORCH_FUNCTIONS,
    )

    torch_functions = {name: getattr(dist, name) for name in GUARDED_TORCH_FUNCTIONS}
    with forbid_pipeline_communication((pp_group,)):
        pass
    # Every wrapper is gone: torch's own functions, the group's class methods.
    assert {name: getattr(dist, name) for name in GUARDED_TORCH_FUNCTIONS} == torch_functions
    assert not set(GUARDED_GROUP_METHODS) & set(vars(pp_group))
    gathered = [None]
    dist.all_gather_object(gathered, {"step": 1}, group=pp_group.cpu_group)
    assert gathered == [{"step": 1}]  # a real gloo exchange on the pipeline group
    pp_group.barrier()  # real gloo barrier, world size 1


def test_graph_safe_collectives_on_the_pp_group_pass(pp_group):
    """All-reduce and all-gather are recorded into graphs legitimately (inside
    the model); the guard must let them through even on the pipeline group."""
    with forbid_pipeline_communication((pp_group,)):
        summed = torch.ones(3)
        dist.all_reduce(summed, group=pp_group.cpu_group)
        gathered = [torch.zeros(2)]
        dist.all_gather(gathered, torch.full((2,), 7.0), group=pp_group.cpu_group)
    assert summed.tolist() == [1.0, 1.0, 1.0]  # world size 1: the real reduce ran
    assert gathered[0].tolist() == [7.0, 7.0]


def test_guard_is_per_thread(pp_group):
    seen = {}

    def other_thread():
        seen["active"] = capture_guard_active()
        gathered = [None]
        try:  # a guarded function on the pipeline group, while the main thread captures
            dist.all_gather_object(gathered, "other thread", group=pp_group.cpu_group)
        except CapturedCommunicationError as exc:  # pragma: no cover - reported below
            gathered = [exc]
        seen["gathered"] = gathered

    with forbid_pipeline_communication((pp_group,)):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        with pytest.raises(CapturedCommunicationError, match="all_gather_object"):
            dist.all_gather_object([None], "this thread", group=pp_group.cpu_group)
    assert seen == {"active": False, "gathered": ["other thread"]}


def test_nested_guards_restore_cleanly(pp_group):
    original = type(pp_group).send_tensor_dict
    with forbid_pipeline_communication((pp_group,)):
        with forbid_pipeline_communication((pp_group,)):
            assert capture_guard_active()
        assert capture_guard_active()
    assert not capture_guard_active()
    assert pp_group.send_tensor_dict.__func__ is original


def test_error_inside_capture_still_restores(pp_group):
    with pytest.raises(ValueError):
        with forbid_pipeline_communication((pp_group,)):
            raise ValueError("capture failed")
    assert not capture_guard_active()
    assert "send_tensor_dict" not in vars(pp_group)
