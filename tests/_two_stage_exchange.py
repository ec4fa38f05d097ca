"""Two CPU processes as pipeline stages 0 and 1 (gloo), run by test_graph_agreement."""

from __future__ import annotations

import json
import sys


def main(rank: int, port: int) -> None:
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
    # Stage 1 "fails" its capture; both must decide on eager.
    mine = CaptureOutcome(rank, frozenset({"a", "b"}), None if rank == 0 else "OOM")
    with torch.inference_mode():  # as during capture_model
        outcomes = gather_from_stages(mine)
    result = agree(outcomes, rank)
    print(json.dumps({"rank": rank, "stages": [o.stage for o in outcomes],
                      "all_eager": result.all_eager, "reason": result.reason}))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
