"""NCCL send/recv and all-reduce between two GPUs per message size, under each interconnect
``bench --interconnect`` simulates, fitted to what ``plan`` reads (planning/links.json)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.tools.cost_table import fit_line
from vllm_pp_cudagraph.commands.bench.interconnect import INTERCONNECT_ENV, INTERCONNECTS

#: Message sizes timed, in bytes: a small model's decode hand-off up to a large prefill chunk's.
SIZES = tuple(2 ** k for k in range(10, 27, 2))
WARMUP = 5
ITERS = 20


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

    os.environ.update(INTERCONNECT_ENV[interconnect])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    peer = 1 - rank
    rows = []
    for size in SIZES:
        buf = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda")

        def ping_pong():  # one round trip, two transfers
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
    """Every size under ``interconnect`` in fresh processes (NCCL reads its environment once),
    and each op fitted to ``latency + bytes / bandwidth``."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, interconnect, port, queue)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    result = queue.get(timeout=600)
    for proc in procs:
        proc.join(60)
    for op in ("send_recv", "all_reduce"):
        latency, seconds_per_byte = fit_line([(r["bytes"], r[f"{op}_s"]) for r in result["rows"]])
        result[op] = {"latency_s": max(latency, 0.0), "bytes_per_s": 1.0 / seconds_per_byte}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    links = {}
    for i, name in enumerate(INTERCONNECTS):
        links[name] = measure(name, 29650 + i)
        fits = {op: links[name][op] for op in ("send_recv", "all_reduce")}
        print(name, json.dumps(fits), flush=True)
    (args.out / "links.json").write_text(json.dumps(links, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
