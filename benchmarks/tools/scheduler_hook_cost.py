"""What the plugin's scheduler hook costs the engine core per step, on CPU.

vLLM's real ``AsyncScheduler`` at PP=2 with RUNNING requests all decoding (1,024 by
default, 64-token prompts), driven as the engine core drives it (``pp_size`` batches in
flight, the oldest output processed once the queue is full). Each cadence runs the same
steps; the figure is the host time of ``schedule()`` plus ``update_from_output()`` per
step, median over the timed steps, against stock (no hook):

    python benchmarks/tools/scheduler_hook_cost.py --running 1024 --steps 400 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm_pp_cudagraph.engine_core.decode_cadence import PPCadenceScheduler
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

BLOCK = 16
CADENCES = ("stock", "vllm", "balance", "merge", "auto")


class _MRV2Config(VllmConfig):
    use_v2_model_runner = True


def empty_scheduler(model_dir: str, max_num_seqs: int, prompt: int, output: int,
                    pp: int = 2, settings: PPCudaGraphSettings | None = None) -> AsyncScheduler:
    """vLLM's async scheduler at PP=``pp`` with room for ``max_num_seqs`` requests of
    ``prompt`` + ``output`` tokens to the end, none added yet."""
    max_len = prompt + output + BLOCK
    blocks = max_num_seqs * (max_len // BLOCK + 2)
    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=max_len),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=8192,
                                         max_model_len=max_len, is_encoder_decoder=False,
                                         async_scheduling=True),
        parallel_config=ParallelConfig(pipeline_parallel_size=1),
        device_config=DeviceConfig(device="cpu"),
    )
    # Built at PP=1 (on CPU vLLM configures V1, which refuses PP with async scheduling);
    # the scheduler reads the pipeline size when constructed.
    config.parallel_config.pipeline_parallel_size = pp
    config.cache_config.num_gpu_blocks = blocks
    kv_cache = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=16, dtype=torch.float32))])
    config.__class__ = _MRV2Config
    kwargs = dict(vllm_config=config, kv_cache_config=kv_cache,
                  structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)
    # The plugin's scheduler where ``settings`` ask for a cadence, else vLLM's.
    scheduler = (AsyncScheduler(**kwargs) if settings is None
                 else PPCadenceScheduler(**kwargs, settings=settings))
    scheduler.use_v2_model_runner = True
    return scheduler


def build_scheduler(model_dir: str, running: int, prompt: int, output: int,
                    settings: PPCudaGraphSettings | None = None) -> AsyncScheduler:
    """vLLM's async scheduler at PP=2 with ``running`` requests added."""
    scheduler = empty_scheduler(model_dir, running, prompt, output, settings=settings)
    for i in range(running):
        params = SamplingParams(max_tokens=output, ignore_eos=True)
        scheduler.add_request(Request(request_id=str(i), prompt_token_ids=[5] * prompt,
                                      sampling_params=params, pooling_params=None))
    return scheduler


def step_times(scheduler: AsyncScheduler, steps: int, warmup: int) -> list[float]:
    """Host seconds of each step's ``schedule()`` and its output's ``update_from_output()``."""
    in_flight: deque = deque()
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        output = scheduler.schedule()
        in_flight.append(output)
        if len(in_flight) > scheduler.pp_size:
            done = in_flight.popleft()
            ids = list(done.num_scheduled_tokens)
            scheduler.update_from_output(done, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=[[7] for _ in ids]))
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times


def measure(model_dir: str, cadence: str, args: argparse.Namespace) -> dict:
    settings = None if cadence == "stock" else PPCudaGraphSettings(
        decode_cadence=cadence, metrics=args.metrics, metrics_dir=args.metrics_dir)
    scheduler = build_scheduler(model_dir, args.running, args.prompt, args.output, settings)
    times = step_times(scheduler, args.steps, args.warmup)
    decoding = sum(1 for r in scheduler.running if r.num_output_tokens > 0)
    return {"cadence": cadence, "median_ms": 1e3 * statistics.median(times),
            "mean_ms": 1e3 * statistics.fmean(times), "steps": len(times),
            "running_at_end": len(scheduler.running), "decoding_at_end": decoding}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=60,
                        help="steps before timing (prefill and the first decodes)")
    parser.add_argument("--rounds", type=int, default=3, help="every cadence this many times")
    parser.add_argument("--metrics", type=int, default=1, help="the plugin's metrics on (1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        args.metrics_dir = str(Path(tmp) / "metrics")
        model_dir = str(write_model_dir(Path(tmp) / "model", tokenizer=False))
        rows = [measure(model_dir, c, args) for _ in range(args.rounds) for c in CADENCES]
    by = {c: statistics.median(r["median_ms"] for r in rows if r["cadence"] == c)
          for c in CADENCES}
    summary = {c: {"median_ms": round(ms, 3), "over_stock_ms": round(ms - by["stock"], 3)}
               for c, ms in by.items()}
    for cadence, row in summary.items():
        print(f"{cadence:8s} {row['median_ms']:7.3f} ms per step "
              f"({row['over_stock_ms']:+.3f} over stock)")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scheduler_hook_cost.json").write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k not in ("out", "metrics_dir")},
             "summary": summary, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
