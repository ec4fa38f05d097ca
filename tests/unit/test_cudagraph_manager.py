"""PPCudaGraphManager: dispatch as stock does where stock is right, agreement, the guard."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import NoGraphPoolPlatform
from vllm.compilation import breakable_cudagraph
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

from vllm_pp_cudagraph.worker.graphs.graph_agreement import Agreement

VLLM_LIKE = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def all_capture_descs(manager):
    return [d for descs in manager._capture_descs.values() for d in descs]


def test_served_shape_dispatches_every_batch_as_stock_does(make_manager):
    """The serving soak's shape (max_num_seqs 256, vLLM's default capture sizes):
    stock captures only uniform FULL shapes there, so every batch must replay the
    very graph stock would replay."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, 513, 16)]
    stock = make_manager("FULL_AND_PIECEWISE", sizes, 256, cls=ModelCudaGraphManager)
    ours = make_manager("FULL_AND_PIECEWISE", sizes, 256)
    assert set(all_capture_descs(ours)) == set(all_capture_descs(stock))
    stock._graphs_captured = ours._graphs_captured = True
    for num_reqs in range(1, 257):
        for num_tokens in (num_reqs, num_reqs + 1, num_reqs * 3, 512, 513):
            uniform = 1 if num_tokens == num_reqs else None
            assert ours.dispatch(num_reqs, num_tokens, uniform, 0) == stock.dispatch(
                num_reqs, num_tokens, uniform, 0), (num_reqs, num_tokens)


def test_non_uniform_full_shapes_exist_in_stock_and_are_dropped(make_manager):
    # max_num_seqs=8, capture size 13: stock captures 13 tokens over 8 requests.
    sizes = [1, 2, 4, 8, 13, 16]
    stock = make_manager("FULL", sizes, 8, cls=ModelCudaGraphManager)
    ours = make_manager("FULL", sizes, 8)
    assert any(d.num_tokens == 13 for d in all_capture_descs(stock))
    assert not any(d.num_tokens == 13 for d in all_capture_descs(ours))
    ours._graphs_captured = True
    for num_tokens in (9, 12, 13):
        desc = ours.dispatch(8, num_tokens, None, 0)
        assert (desc.cg_mode, desc.num_tokens, desc.num_reqs) == (CUDAGraphMode.FULL, 16, 8)


def test_agreement_prunes_dispatch_on_every_stage(make_manager):
    manager = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8)
    manager._graphs_captured = True
    descs = all_capture_descs(manager)
    keep = frozenset(d for d in descs if d.num_tokens <= 16)
    manager.apply_agreement(Agreement(keep, frozenset(descs) - keep, "test"))
    assert set(all_capture_descs(manager)) == keep
    assert manager.dispatch(4, 4, 1, 0).num_tokens == 4
    assert manager.dispatch(8, 40, None, 0).cg_mode == CUDAGraphMode.NONE


def test_all_eager_agreement_turns_every_dispatch_eager(make_manager):
    manager = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8)
    manager._graphs_captured = True
    manager.apply_agreement(Agreement(frozenset(), frozenset(all_capture_descs(manager)), "failed"))
    assert not manager.needs_capture()
    for r in range(1, 9):
        assert manager.dispatch(r, r, 1, 0).cg_mode == CUDAGraphMode.NONE


def test_capture_runs_under_the_guard_and_settles_before_raising(make_manager, monkeypatch):
    """A forward that talks to the next stage during capture fails capture on
    this stage, the failure is shared (peers fall back to eager instead of
    waiting), and the guard's error is raised afterwards."""
    import torch
    from vllm.distributed.parallel_state import get_pp_group

    from vllm_pp_cudagraph.worker.graphs.capture_guard import CapturedCommunicationError

    def forward_that_sends(self, *args, **kwargs):  # stands in for vLLM's capture body
        get_pp_group().send_tensor_dict({"hidden_states": torch.zeros(1, 4)})

    monkeypatch.setattr(ModelCudaGraphManager, "capture", forward_that_sends)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (0, 0))
    manager = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8)
    settled = []
    monkeypatch.setattr(manager, "apply_agreement", settled.append)
    with pytest.raises(CapturedCommunicationError, match="send_tensor_dict"):
        manager.capture()
    assert len(settled) == 1 and settled[0].all_eager
    assert "CapturedCommunicationError" in settled[0].reason


def test_a_capture_leaves_a_record_of_what_it_took_beside_the_estimate(
        make_manager, monkeypatch, tmp_path):
    """The soak checks each stage's graphs against what the plugin reserved for them
    before the KV cache was sized; it reads that from the record, not the log."""
    import torch

    from vllm_pp_cudagraph.shared.snapshots import METRICS_DIR_ENV, read_capture_records

    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path))
    free = iter([10 << 30, 9 << 30])
    monkeypatch.setattr(ModelCudaGraphManager, "capture", lambda self, *a, **kw: None)
    monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (next(free), 0))
    manager = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8)
    monkeypatch.setattr(manager, "settle_with_other_stages", lambda error=None: None)
    manager.estimated_bytes = 3 << 29
    manager.capture()
    (record,) = read_capture_records(tmp_path).values()
    assert record["estimated_gib"] == 1.5 and record["captured_gib"] == 1.0


def test_stage_with_nothing_to_capture_still_settles(make_manager):
    manager = make_manager("NONE", [1, 2, 4], 8)
    assert not manager.needs_capture()
    manager.settle_with_other_stages()
    assert manager.dispatch(2, 2, 1, 0).cg_mode == CUDAGraphMode.NONE


def test_a_runner_with_vllms_manager_or_none_is_refused(make_manager):
    """The runner's own manager must be the plugin's: vLLM's, or none where vLLM built no
    manager at all, is refused naming the setting (every release, FastPrefillHelper or not)."""
    import types

    from vllm_pp_cudagraph.worker.model_runner import check_manager_holders

    runner = types.SimpleNamespace(cudagraph_manager=make_manager("FULL_AND_PIECEWISE",
                                                                  VLLM_LIKE, 8))
    check_manager_holders(runner)
    runner.cudagraph_manager = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8,
                                            cls=ModelCudaGraphManager)
    with pytest.raises(RuntimeError, match=r"for cudagraph_manager where .*VLLM_PLUGINS"):
        check_manager_holders(runner)
    runner.cudagraph_manager = None
    with pytest.raises(RuntimeError, match=r"for the runner where .*VLLM_PLUGINS"):
        check_manager_holders(runner)


def test_a_runner_where_anything_holds_vllms_manager_is_refused(make_manager):
    """vLLM builds the plugin's manager where it builds its own; if a release builds its
    own some other way, whatever holds it (here FastPrefillHelper, 0.33) is named."""
    import types

    from vllm_pp_cudagraph.worker.model_runner import check_manager_holders

    attn_utils = pytest.importorskip("vllm.v1.worker.gpu.attn_utils")
    if not hasattr(attn_utils, "FastPrefillHelper"):
        pytest.skip("this vLLM has no FastPrefillHelper (added in 0.33)")
    ours = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8, 2)
    stock = make_manager("FULL_AND_PIECEWISE", VLLM_LIKE, 8, 2, cls=ModelCudaGraphManager)
    runner = types.SimpleNamespace(cudagraph_manager=ours,
                                   fast_prefill=attn_utils.FastPrefillHelper(ours, 8))
    check_manager_holders(runner)
    runner.fast_prefill = attn_utils.FastPrefillHelper(stock, 8)
    with pytest.raises(RuntimeError, match=r"fast_prefill\.cudagraph_manager.*VLLM_PLUGINS"):
        check_manager_holders(runner)
    runner.fast_prefill, runner.cudagraph_manager = None, stock
    with pytest.raises(RuntimeError, match="for cudagraph_manager "):
        check_manager_holders(runner)


def _breakable_manager(make_manager, monkeypatch):
    monkeypatch.setattr(breakable_cudagraph, "current_platform", NoGraphPoolPlatform())
    manager = make_manager("PIECEWISE", [1, 2, 4], 4)
    manager.pool = object()
    return manager


def test_breakable_runner_is_built_once_on_the_managers_pool(make_manager, monkeypatch):
    manager = _breakable_manager(make_manager, monkeypatch)
    model = torch.nn.Identity()
    manager.init_breakable_cg_runner(model)
    runner = manager.breakable_cg_runner
    assert isinstance(runner, breakable_cudagraph.BreakableCUDAGraphWrapper)
    assert runner.runnable is model and runner.graph_pool is manager.pool
    manager.init_breakable_cg_runner(torch.nn.Identity())
    assert manager.breakable_cg_runner is runner


@pytest.mark.skipif(
    "key_fn" not in inspect.signature(breakable_cudagraph.BreakableCUDAGraphWrapper).parameters,
    reason="this vLLM's breakable wrapper keys graphs by batch descriptor only (before 0.33)",
)
def test_breakable_runner_keeps_the_graph_key_vllm_asks_for(make_manager, monkeypatch):
    manager = _breakable_manager(make_manager, monkeypatch)

    def by_step(**kwargs):
        return kwargs["spec_step_idx"]

    manager.init_breakable_cg_runner(torch.nn.Identity(), key_fn=by_step)
    assert manager.breakable_cg_runner.key_fn is by_step
