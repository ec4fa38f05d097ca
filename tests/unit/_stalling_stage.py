"""One pipeline stage as a CPU process over gloo, for the stall watch's tests.

Run as ``_stalling_stage.py STAGE PP PORT DIR SCENARIO LIMIT_S``. The stage keeps a
heartbeat in DIR as the plugin's runner does and runs one step per ``step`` line on
its stdin: the first stage computes and sends a tensor on, the others receive it
(between steps, as vLLM's worker does before the runner's forward) and compute; the
last prints ``done N`` once step N is through. In SCENARIO the last stage goes wrong at
step 3:

- ``receive``: the first stage sends nothing more, so the last blocks forever in a receive;
- ``step``: the last stage blocks forever inside its forward pass;
- ``under``: the last stage's forward takes 70% of LIMIT_S, then goes on;
- ``healthy``: nothing goes wrong; each of the last stage's steps takes 0.5 s.
"""

from __future__ import annotations

import datetime
import faulthandler
import sys
import threading
import time
from pathlib import Path

WRONG_STEP = 3


def blocked_forever_in_forward() -> None:
    threading.Event().wait()


def main() -> None:
    stage, pp, port, directory, scenario, limit_s = sys.argv[1:7]
    stage, pp, limit_s = int(stage), int(pp), float(limit_s)
    import torch
    import torch.distributed as dist

    from vllm_pp_cudagraph.shared.heartbeats import STACKS_SIGNAL, Heartbeat, heartbeat_path

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=stage,
                            world_size=pp, timeout=datetime.timedelta(seconds=60))
    heartbeat = Heartbeat(heartbeat_path(Path(directory), 0, stage, 0), stage, 0)
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
    print("ready", flush=True)
    hidden = torch.zeros(4)
    step = 0
    for line in sys.stdin:
        if line.strip() != "step":
            continue
        step += 1
        wrong = step == WRONG_STEP
        if stage > 0:
            dist.recv(hidden, src=stage - 1)  # between steps, as vLLM's worker receives
        heartbeat.begin()
        if wrong and stage == pp - 1 and scenario == "step":
            blocked_forever_in_forward()
        if wrong and stage == pp - 1 and scenario == "under":
            time.sleep(0.7 * limit_s)
        if stage == pp - 1 and scenario == "healthy":
            time.sleep(0.5)
        hidden = hidden + 1
        heartbeat.step_done()
        if stage < pp - 1 and not (step >= WRONG_STEP and scenario == "receive"):
            dist.send(hidden, dst=stage + 1)
        if stage == pp - 1:
            print(f"done {step}", flush=True)


if __name__ == "__main__":
    main()
