"""What a link between two GPUs costs: NCCL send/recv and all-reduce, timed per message
size under each interconnect the bench can simulate (``bench --interconnect``), fitted to a
latency and a bandwidth that ``plan`` reads (src/vllm_pp_cudagraph/commands/planning/links.json).

    python -m benchmarks.tools.link_bench --out DIR [--interconnect nvlink host socket]

Needs 2 GPUs. Each interconnect runs in fresh processes, since NCCL reads its environment
once, when the communicator is made. DIR/links.json holds every timed point and the fit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

#: Message sizes timed, in bytes: one decode token's hidden state of a small model up to a
#: prefill chunk's hand-off of a large one.
SIZES = tuple(2 ** k for k in range(10, 27, 2))
WARMUP = 5
ITERS = 20


def fit(points: list[tuple[int, float]]) -> dict[str, float]:
    """Latency and bandwidth of ``t = latency + bytes / bandwidth`` by least squares over
    the timed (bytes, seconds) points; the latency is never below zero."""
    xs = [float(n) for n, _ in points]
    ys = [t for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    latency = max(my - slope * mx, 0.0)
    return {"latency_s": latency, "bytes_per_s": 1.0 / slope}


def _time(op, iters: int) -> float:
    import torch
    for _ in range(WARMUP):
        op()
    torch.cuda.synchronize()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        op()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _worker(rank: int, interconnect: str, port: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from vllm_pp_cudagraph.commands.bench.interconnect import INTERCONNECT_ENV
    os.environ.update(INTERCONNECT_ENV[interconnect])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    peer = 1 - rank
    rows = []
    for size in SIZES:
        buf = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda")

        def ping_pong():
            # Rank 0 sends then receives, rank 1 the reverse: one round trip, two transfers.
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)

        one_way = _time(ping_pong, ITERS) / 2
        all_reduce = _time(lambda: dist.all_reduce(buf), ITERS)
        rows.append({"bytes": size, "send_recv_s": one_way, "all_reduce_s": all_reduce})
    if rank == 0:
        queue.put({"rows": rows, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                   "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__})
    dist.barrier()
    dist.destroy_process_group()


def measure(interconnect: str, port: int) -> dict:
    """Every size under ``interconnect``, and the fits of send/recv and all-reduce. The
    all-reduce's bandwidth is the ring's bus bandwidth (2 ranks move the message once
    each way), so ``Link.all_reduce_s`` gives back the timed points."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, interconnect, port, queue)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    result = queue.get(timeout=600)
    for proc in procs:
        proc.join(60)
    rows = result["rows"]
    result["send_recv"] = fit([(r["bytes"], r["send_recv_s"]) for r in rows])
    result["all_reduce"] = fit([(r["bytes"], r["all_reduce_s"]) for r in rows])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interconnect", nargs="+", default=["nvlink", "host", "socket"])
    parser.add_argument("--port", type=int, default=29650)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    links = {}
    for i, name in enumerate(args.interconnect):
        links[name] = measure(name, args.port + i)
        fits = {op: links[name][op] for op in ("send_recv", "all_reduce")}
        print(name, json.dumps(fits), flush=True)
    (args.out / "links.json").write_text(json.dumps(links, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
