"""Pipeline stages agree on one set of CUDA graphs, or on running eagerly together."""

from __future__ import annotations

from vllm_pp_cudagraph.graph_agreement import CaptureOutcome, agree

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


def test_two_stages_reach_the_same_decision_over_gloo_under_inference_mode():
    from _pipeline_processes import run_stages

    results = run_stages("capture")
    for r in results:
        assert r["stages"] == [0, 1]
        assert r["all_eager"] is True
        assert "stage 1: OOM" in r["reason"]


def test_two_stages_keep_only_the_graphs_both_captured_over_gloo():
    """Each stage learns the other's graphs only through the exchange: stage 0
    captured {a, b}, stage 1 {b, c}; both must keep exactly {b}."""
    from _pipeline_processes import run_stages

    results = run_stages("common")
    assert [r["keep"] for r in results] == [["b"], ["b"]]
    assert [r["dropped"] for r in results] == [["a"], ["c"]]
