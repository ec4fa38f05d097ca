"""Pipeline stages agree on one set of CUDA graphs, or on running eagerly together."""

from __future__ import annotations

import pytest

from vllm_pp_cudagraph.worker.graphs.graph_agreement import CaptureOutcome, agree, merge_tp_peers

A, B, C = "desc-a", "desc-b", "desc-c"


def both(d0, d1, err0=None, err1=None):
    return [CaptureOutcome(0, frozenset(d0), err0), CaptureOutcome(1, frozenset(d1), err1)]


def test_identical_captures_are_kept_whole():
    outcomes = both({A, B}, {A, B})
    for stage in (0, 1):
        result = agree(outcomes, stage)
        assert result.keep == {A, B} and not result.dropped and result.reason is None


def test_one_failed_stage_makes_every_stage_eager():
    outcomes = both({A, B}, set(), err1="OutOfMemoryError: CUDA out of memory")
    for stage in (0, 1):
        result = agree(outcomes, stage)
        assert result.all_eager
        assert "stage 1: OutOfMemoryError" in result.reason
    assert agree(outcomes, 0).dropped == {A, B}


def test_different_captures_keep_only_the_common_graphs_on_every_stage():
    outcomes = both({A, B}, {B, C})
    r0, r1 = agree(outcomes, 0), agree(outcomes, 1)
    assert r0.keep == r1.keep == {B}
    assert r0.dropped == {A} and r1.dropped == {C}
    assert "cudagraph_mode" in r0.reason


def test_nothing_in_common_means_eager_everywhere():
    outcomes = both({A}, {C})
    assert agree(outcomes, 0).all_eager and agree(outcomes, 1).all_eager


def test_decision_is_the_same_on_every_stage_for_four_stages():
    outcomes = [CaptureOutcome(i, frozenset({A, B} if i % 2 else {A, B, C})) for i in range(4)]
    keeps = {agree(outcomes, i).keep for i in range(4)}
    assert keeps == {frozenset({A, B})}


def test_tp_peers_merge_into_their_stages_outcome_naming_the_failed_rank():
    merged = merge_tp_peers([CaptureOutcome(1, frozenset({A, B})),
                             CaptureOutcome(1, frozenset(), "OutOfMemoryError: CUDA out of memory")])
    assert merged == CaptureOutcome(1, frozenset(), "TP rank 1: OutOfMemoryError: CUDA out of memory")
    merged = merge_tp_peers([CaptureOutcome(0, frozenset({A, B})), CaptureOutcome(0, frozenset({B}))])
    assert merged == CaptureOutcome(0, frozenset({B}))


def test_a_failure_tells_the_user_what_to_change():
    reason = agree(both({A}, set(), err1="TP rank 1: OOM"), 0).reason
    assert "stage 1: TP rank 1: OOM" in reason and "gpu_memory_utilization" in reason
    assert "enforce_eager=True" in reason


@pytest.mark.parametrize("tp_size", [1, 2])
def test_every_rank_goes_eager_when_one_rank_fails_capture_over_gloo(tp_size):
    """Under inference mode, as vLLM captures; with TP=2 the failing rank's TP peer and
    the other stage's ranks must all go eager with it, or their collectives hang."""
    from _pipeline_processes import run_stages

    results = run_stages("capture", tp_size=tp_size)
    assert sorted((r["stage"], r["tp_rank"]) for r in results) == sorted(
        (s, t) for s in range(2) for t in range(tp_size))
    for r in results:
        assert r["all_eager"] is True
        assert "stage 1: " + ("TP rank 1: OOM" if tp_size > 1 else "OOM") in r["reason"]


@pytest.mark.parametrize("tp_size", [1, 2])
def test_every_rank_keeps_only_the_graphs_all_captured_over_gloo(tp_size):
    """Each rank learns the others' graphs only through the exchange: stage 0 captured
    {a, b} ({b} alone on one TP peer when TP=2), stage 1 {b, c}; all keep exactly {b}."""
    from _pipeline_processes import run_stages

    results = run_stages("common", tp_size=tp_size)
    assert [r["keep"] for r in results] == [["b"]] * 2 * tp_size
