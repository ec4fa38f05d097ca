"""A stage on vLLM's own runner beside the plugin's: the plugin's stage stops with one
clear error instead of waiting forever for a peer that never joins its exchanges (two Ray
nodes, one without the package, hung this way at start-up)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from vllm_pp_cudagraph.worker.pipeline.stage_exchange import (
    PeerRunnerError,
    announce_runner,
    check_peer_runners,
)


def test_peers_that_announced_the_plugins_runner_pass_at_once():
    store = dist.HashStore()
    for rank in (0, 1, 2):
        announce_runner(rank, store)
    check_peer_runners({0: "pipeline stage 0", 1: "pipeline stage 1", 2: "pipeline stage 2"},
                       store, timeout_s=0.1)


def test_a_peer_without_the_plugins_runner_is_named_with_the_setting_to_change():
    store = dist.HashStore()
    announce_runner(0, store)
    with pytest.raises(PeerRunnerError) as err:
        check_peer_runners({0: "pipeline stage 0", 1: "pipeline stage 1"}, store,
                           timeout_s=0.1)
    message = str(err.value)
    assert "pipeline stage 1 did not start the plugin's runner" in message
    assert "stage 0" not in message.split(" did not")[0]
    assert "VLLM_PLUGINS=pp_cudagraph" in message and "Install vllm-pp-cudagraph" in message


@pytest.mark.parametrize("stock", [0, 1])
def test_the_plugins_stage_stops_at_its_first_exchange_beside_a_stock_stage(stock):
    from _pipeline_processes import run_stages

    results = run_stages(f"stock-stage-{stock}")
    plugin = results[1 - stock]
    assert plugin["error"] and f"pipeline stage {stock} did not start" in plugin["error"]
    assert plugin["seconds"] < 10


def test_a_tp_peer_without_the_plugins_runner_stops_its_stage_too():
    """A node running TP rank 1 of every stage without the package: each stage's TP rank 0
    names its TP peer instead of hanging in the first TP exchange."""
    from _pipeline_processes import run_stages

    results = run_stages("stock-tp-peers", tp_size=2, pp_size=2)
    for rank in (0, 2):
        stage = rank // 2
        error = results[rank]["error"]
        assert error and f"pipeline stage {stage} TP rank 1 did not start" in error
        assert results[rank]["seconds"] < 10
