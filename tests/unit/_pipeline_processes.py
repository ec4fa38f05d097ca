"""CPU processes as pipeline stages over gloo, with vLLM's own process groups.

Scenarios, each run on every stage by :func:`run_stages`:

- ``capture``: every rank agrees on eager after the last rank's capture failed;
  ``common``: they keep the graphs every rank captured, TP peers included
  (test_graph_agreement);
- ``handoff``: the start-up hand-off check, first with what the model declares,
  then with a forward that returns an undeclared key, then with the direct
  hand-off on one stage only (test_stage_inputs);
- ``eagle3``: the same check on an EAGLE3 target, whose aux hidden states vLLM
  reserves on the receiving stages only (test_stage_inputs);
- ``stock-stage-0`` / ``stock-stage-1``: that stage runs vLLM's own runner, the other
  the plugin's, whose first exchange must stop it with a clear error instead of waiting
  for a stage that never joins (test_stage_exchange); ``stock-tp-peers``: at TP=2 x PP=2
  every stage's TP rank 1 runs vLLM's own runner (a node holding those ranks without the
  package), and the TP rank 0 ranks must stop the same way (test_stage_exchange);
- ``direct``: intermediate tensors handed on without metadata, next to vLLM's own
  hand-off on the same group, at PP=2 (also with 2 tensor-parallel ranks per
  stage) and PP=3 (test_stage_handoff).
"""

from __future__ import annotations

import json
import sys


def run_stages(scenario: str, tp_size: int = 1, pp_size: int = 2) -> list[dict]:
    """Run ``scenario`` on ``pp_size`` stages of ``tp_size`` processes each; their reports."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PP_CUDAGRAPH_")}
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__)), str(r), str(port), scenario,
                          str(tp_size), str(pp_size)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(pp_size * tp_size)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def handoff(rank: int) -> dict:
    from types import SimpleNamespace

    import torch
    from vllm.sequence import IntermediateTensors

    from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner
    from vllm_pp_cudagraph.worker.pipeline.stage_handoff import HandoffDisagreementError
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import StageInputMismatchError, schema_of

    def tensors(n: int, keys=("hidden_states", "residual")) -> dict:
        return {k: torch.zeros(n, 16, dtype=torch.bfloat16) for k in keys}

    class Model:
        def make_empty_intermediate_tensors(self, batch_size, dtype, device):
            return IntermediateTensors(tensors(batch_size))

    # The runner's state that the check reads, on a CPU stage without a GPU runner.
    stage = SimpleNamespace(
        is_last_pp_rank=rank == 1,
        intermediate_tensors=IntermediateTensors(tensors(8)) if rank == 1 else None,
        model=Model(),
        model_config=SimpleNamespace(dtype=torch.bfloat16),
        device="cpu",
        direct_handoff=False,
    )
    check = PPCudaGraphModelRunner._check_stage_handoffs
    check(stage)  # as declared: matches
    produced = schema_of(tensors(8, ("hidden_states", "residual", "aux"))) if rank == 0 else None
    try:
        check(stage, produced=produced)
        error = None
    except StageInputMismatchError as exc:
        error = str(exc)
    stage.direct_handoff = rank == 1  # one stage's process without the setting
    try:
        check(stage)
        direct_error = None
    except HandoffDisagreementError as exc:
        direct_error = str(exc)
    return {"rank": rank, "produced_error": error, "direct_error": direct_error}


def stock_stage(rank: int, stock: int) -> dict:
    """Rank ``stock`` runs vLLM's own runner (it never announces itself nor joins the
    plugin's exchanges); the other runs the plugin's start-up hand-off check."""
    import time

    from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner
    from vllm_pp_cudagraph.worker.pipeline import stage_exchange

    if rank == stock:
        time.sleep(4)  # alive, as a stage in vLLM's own start-up would be
        return {"rank": rank, "error": None}
    stage_exchange.announce_runner(rank)
    stage_exchange.PEER_WAIT_S = 1.0
    start = time.monotonic()
    try:
        PPCudaGraphModelRunner._check_stage_handoffs(None)
        error = None
    except stage_exchange.PeerRunnerError as exc:
        error = str(exc)
    return {"rank": rank, "error": error, "seconds": time.monotonic() - start}


#: EAGLE3 over PP in the ``eagle3`` scenario: 28 layers as 10/9/9, taps at these layers.
EAGLE3_LAYERS, EAGLE3_SPLIT, EAGLE3_TAPS = 28, (10, 9, 9), (2, 14, 25)


def _eagle3_stage(stage: int, pp_size: int):
    """A stage of an EAGLE3 target as vLLM builds it: the decoder with vLLM's own
    aux-state bookkeeping (``EagleModelMixin``), its input buffers with the aux
    slots vLLM reserves, and the tensors its forward returns."""
    from types import SimpleNamespace

    import torch
    from vllm.model_executor.models.interfaces import EagleModelMixin
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.gpu.spec_decode.eagle import eagle3_utils

    start = sum(EAGLE3_SPLIT[:stage])
    end = start + EAGLE3_SPLIT[stage]

    def base(n: int) -> dict:
        return {k: torch.zeros(n, 16, dtype=torch.bfloat16) for k in ("hidden_states", "residual")}

    class Decoder(EagleModelMixin):
        supports_aux_hidden_states_over_pp = True
        start_layer, end_layer, config = start, end, SimpleNamespace(hidden_size=16)

    class Model:
        model = Decoder()

        def make_empty_intermediate_tensors(self, batch_size, dtype, device):
            return IntermediateTensors(base(batch_size))

    model = Model()
    model.model._set_aux_hidden_state_layers(EAGLE3_TAPS)
    eagle3_utils.reserve_aux_intermediate_tensor_slots(model)
    # What the forward returns on a non-last stage (Qwen2Model.forward's taps),
    # plus the aux states a middle stage relays (PPHandler.relay_aux_hidden_states).
    taps: list = []
    row = torch.zeros(8, 16, dtype=torch.bfloat16)
    if stage == 0:
        model.model._maybe_add_hidden_state(taps, start, row, None)
    for idx in range(start, end):
        model.model._maybe_add_hidden_state(taps, idx + 1, row, None)
    relayed = {k: row for k in eagle3_utils.aux_hidden_state_relay_keys(model)}
    produced = {**base(8), **model.model.pack_local_aux_hidden_states(taps), **relayed}
    buffers = model.make_empty_intermediate_tensors(8, torch.bfloat16, "cpu") if stage else None
    return model, buffers, produced


def eagle3(rank: int, pp_size: int) -> dict:
    """The start-up hand-off check on an EAGLE3 target over ``pp_size`` stages: as
    declared, as produced, and as produced with one aux state missing."""
    from types import SimpleNamespace

    import torch

    from vllm_pp_cudagraph.worker.model_runner import PPCudaGraphModelRunner
    from vllm_pp_cudagraph.worker.pipeline.stage_inputs import StageInputMismatchError, schema_of

    model, buffers, produced = _eagle3_stage(rank, pp_size)
    stage = SimpleNamespace(
        is_last_pp_rank=rank == pp_size - 1, intermediate_tensors=buffers, model=model,
        model_config=SimpleNamespace(dtype=torch.bfloat16), device="cpu", direct_handoff=False,
    )
    sent = None if stage.is_last_pp_rank else produced
    report = {"rank": rank, "expects": sorted(buffers.tensors) if buffers else None,
              "sends": sorted(sent) if sent else None}
    check = PPCudaGraphModelRunner._check_stage_handoffs
    for name, schema in (("declared", None), ("produced", sent),
                         ("produced_lacking", sent and {k: v for k, v in sent.items()
                                                        if k != "aux_hidden_states_1"})):
        try:
            check(stage, produced=schema and schema_of(schema))
            report[name] = None
        except StageInputMismatchError as exc:
            report[name] = str(exc)
    return report


#: Token counts of the steps the ``direct`` scenario hands on (buffers hold 32).
DIRECT_STEPS = (8, 3, 32, 16)


def _step_tensors(step: int, n: int) -> dict:
    import torch

    base = torch.arange(n * 16, dtype=torch.float32).view(n, 16)
    # Keys in another order than the receiver's buffers: the order must not matter.
    return {"residual": base * -1 - step, "hidden_states": base + 1000 * step}


def direct(rank: int) -> dict:
    """Stage 0 sends steps of varying size; each later stage receives them into fixed
    buffers and, unless last, sends on what it received plus one."""
    import torch
    from vllm.distributed.parallel_state import GroupCoordinator, get_pp_group, get_tp_group
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.gpu_worker import AsyncIntermediateTensors

    from vllm_pp_cudagraph.worker.pipeline import stage_handoff

    pp, tp = get_pp_group(), get_tp_group()
    blocker = stage_handoff.group_blocker(pp)
    undo = stage_handoff.enable(pp)
    stage = pp.rank_in_group
    report = {"rank": rank, "stage": stage, "blocker": blocker, "steps": []}
    buffers = {k: torch.full((32, 16), float("nan")) for k in ("hidden_states", "residual")}
    for step, n in enumerate(DIRECT_STEPS):
        outgoing = _step_tensors(step, n)
        if not pp.is_first_rank:
            # As vLLM's worker wraps what it receives, and its runner copies it into
            # the persistent buffers (here the buffers themselves).
            tensor_dict, waits, post = pp.irecv_tensor_dict(all_gather_group=tp)
            received = AsyncIntermediateTensors(tensor_dict, comm_handles=waits,
                                                comm_postprocess=post)
            pending = stage_handoff.pending_input(received)
            row = {"pending_before_receive": pending is not None and len(pending) == 0,
                   "nothing_to_wait": waits == [] and post == []}
            stage_handoff.receive_into(pending, buffers, n)
            copied = {k: v[:n].copy_(received.tensors[k][:n]) for k, v in buffers.items()}
            want = {k: v + (stage - 1) for k, v in outgoing.items()}
            row["equal"] = all(torch.equal(copied[k], want[k]) for k in want)
            row["in_buffers"] = all(
                received.tensors[k].data_ptr() == buffers[k].data_ptr() for k in want
            )
            report["steps"].append(row)
            outgoing = {k: v + 1 for k, v in copied.items()}
        if not pp.is_last_rank:
            handles = pp.isend_tensor_dict(outgoing, all_gather_group=tp)
            report["first_handle_done"] = handles[0].is_completed()
            for handle in handles:
                handle.wait()
    # vLLM's own hand-off still works on the group once the plugin's is off.
    undo()
    report["vllm_methods_after_undo"] = all(
        getattr(pp, name).__func__ is getattr(GroupCoordinator, name)
        for name in stage_handoff.DIRECT_METHODS)
    if pp.is_first_rank:
        for handle in pp.isend_tensor_dict(_step_tensors(9, 5), all_gather_group=tp):
            handle.wait()
    elif stage == 1:
        tensor_dict, waits, post = pp.irecv_tensor_dict(all_gather_group=tp)
        received = IntermediateTensors(tensor_dict)
        for handle in waits:
            handle.wait()
        for fn in post:
            fn()
        report["vllm_equal"] = all(
            torch.equal(received.tensors[k], v) for k, v in _step_tensors(9, 5).items()
        )
    return report


def main(rank: int, port: int, scenario: str = "capture", tp_size: int = 1,
         pp_size: int = 2) -> None:
    import torch
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    from vllm_pp_cudagraph.worker.graphs.graph_agreement import CaptureOutcome

    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(pipeline_parallel_size=pp_size,
                                       tensor_parallel_size=tp_size),
    )
    with set_current_vllm_config(config):
        init_distributed_environment(pp_size * tp_size, rank, f"tcp://127.0.0.1:{port}", rank,
                                     "gloo")
        ensure_model_parallel_initialized(tp_size, pp_size)
    from vllm_pp_cudagraph.worker.pipeline.stage_exchange import announce_runner

    if scenario.startswith("stock-stage-"):
        print(json.dumps(stock_stage(rank, int(scenario.rsplit("-", 1)[1]))))
        return
    if scenario == "stock-tp-peers":
        # vLLM's layout: TP innermost, so TP rank 1 of every stage is an odd global rank.
        print(json.dumps(stock_stage(rank, rank if rank % tp_size == 1 else -1)))
        return
    announce_runner(rank)  # as the plugin's runner does on every rank
    if scenario == "direct":
        with torch.inference_mode():  # as the worker's execute_model runs
            print(json.dumps(direct(rank)))
        return
    if scenario == "handoff":
        print(json.dumps(handoff(rank)))
        return
    if scenario == "eagle3":
        print(json.dumps(eagle3(rank, pp_size)))
        return
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group

    from vllm_pp_cudagraph.worker.graphs.cudagraph_manager import settle

    stage, tp_rank = get_pp_group().rank_in_group, get_tp_group().rank_in_group
    if scenario == "common":  # stage 0 {a, b} ({b} on its last TP rank), stage 1 {b, c}
        mine = {"a", "b"} if stage == 0 else {"b", "c"}
        if stage == 0 and tp_size > 1 and tp_rank == tp_size - 1:
            mine = {"b"}
        outcome = CaptureOutcome(stage, frozenset(mine))
    else:  # the last rank of the last stage "fails" its capture; all must go eager
        failed = stage == pp_size - 1 and tp_rank == tp_size - 1
        outcome = CaptureOutcome(stage, frozenset({"a", "b"}), "OOM" if failed else None)
    with torch.inference_mode():  # as during capture_model
        result = settle(outcome)
    print(json.dumps({"rank": rank, "stage": stage, "tp_rank": tp_rank,
                      "all_eager": result.all_eager, "reason": result.reason,
                      "keep": sorted(result.keep), "dropped": sorted(result.dropped)}))

if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
