"""Two CPU processes as pipeline stages 0 and 1 (gloo), run by the tests.

``capture``: the stages agree on graphs after stage 1's capture failed;
``common``: they keep the graphs both captured (test_graph_agreement). ``handoff``: the start-up hand-off check, first with
what the model declares, then with a forward that returns an undeclared key
(test_stage_inputs).
"""

from __future__ import annotations

import json
import sys


def run_both(scenario: str) -> list[dict]:
    """Run ``scenario`` on stages 0 and 1 as two processes; their JSON reports."""
    import os
    import socket
    import subprocess
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_PP_CUDAGRAPH_")}
    procs = [
        subprocess.Popen([sys.executable, str(Path(__file__)), str(r), str(port), scenario],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)
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

    from vllm_pp_cudagraph.model_runner import PPCudaGraphModelRunner
    from vllm_pp_cudagraph.stage_inputs import StageInputMismatchError, schema_of

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
    )
    check = PPCudaGraphModelRunner._check_stage_handoffs
    check(stage)  # as declared: matches
    produced = schema_of(tensors(8, ("hidden_states", "residual", "aux"))) if rank == 0 else None
    try:
        check(stage, produced=produced)
        error = None
    except StageInputMismatchError as exc:
        error = str(exc)
    return {"rank": rank, "produced_error": error}


def main(rank: int, port: int, scenario: str = "capture") -> None:
    import torch
    from vllm.config import DeviceConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    from vllm_pp_cudagraph.graph_agreement import CaptureOutcome, agree
    from vllm_pp_cudagraph.stage_exchange import gather_from_stages

    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        parallel_config=ParallelConfig(pipeline_parallel_size=2),
    )
    with set_current_vllm_config(config):
        init_distributed_environment(2, rank, f"tcp://127.0.0.1:{port}", rank, "gloo")
        ensure_model_parallel_initialized(1, 2)
    if scenario == "handoff":
        print(json.dumps(handoff(rank)))
        return
    if scenario == "common":  # the stages captured overlapping sets
        mine = CaptureOutcome(rank, frozenset({"a", "b"} if rank == 0 else {"b", "c"}))
    else:  # stage 1 "fails" its capture; both must decide on eager
        mine = CaptureOutcome(rank, frozenset({"a", "b"}), None if rank == 0 else "OOM")
    with torch.inference_mode():  # as during capture_model
        outcomes = gather_from_stages(mine)
    result = agree(outcomes, rank)
    print(json.dumps({"rank": rank, "stages": [o.stage for o in outcomes],
                      "all_eager": result.all_eager, "reason": result.reason,
                      "keep": sorted(result.keep), "dropped": sorted(result.dropped)}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
