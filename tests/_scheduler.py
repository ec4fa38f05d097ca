"""vLLM's real ``AsyncScheduler`` at pipeline parallelism, built on CPU for tests (the
plugin's subclass of it where a decode cadence is asked for)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

from vllm_pp_cudagraph.engine_core.decode_cadence import PPCadenceScheduler
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

BLOCK = 16


#: The settings :func:`make_scheduler` builds the plugin's scheduler with (None: vLLM's).
CADENCE: PPCudaGraphSettings | None = None


def use_cadence(settings: PPCudaGraphSettings | None) -> Callable[[], None]:
    """Build schedulers with ``settings`` from now on; return the undo."""
    global CADENCE
    previous, CADENCE = CADENCE, settings

    def undo() -> None:
        global CADENCE
        CADENCE = previous

    return undo


def make_scheduler(model_dir: str, num_blocks: int = 8, pp: int = 2, max_num_seqs: int = 8,
                   settings: PPCudaGraphSettings | None = None, max_model_len: int = 256,
                   max_num_batched_tokens: int = 256) -> AsyncScheduler:
    config = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                 max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         max_model_len=max_model_len, is_encoder_decoder=False,
                                         async_scheduling=True),
        parallel_config=ParallelConfig(pipeline_parallel_size=1),
        device_config=DeviceConfig(device="cpu"),
    )
    # Built at PP=1: on this CPU vLLM configures its V1 runner (MRV2 needs Triton),
    # and from 0.32 it refuses V1 with PP and async scheduling. The scheduler reads
    # the pipeline size when it is constructed, below.
    config.parallel_config.pipeline_parallel_size = pp
    config.cache_config.num_gpu_blocks = num_blocks
    kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=16,
                                                      dtype=torch.float32))])
    # MRV2 needs Triton, so on this CPU vLLM configures V1; the scheduler's PP decode
    # cadence is what is under test, and it follows this flag (the engine's plan, the
    # config's).
    config.__class__ = MRV2Config
    settings = settings or CADENCE
    kwargs = dict(vllm_config=config, kv_cache_config=kv_cache,
                  structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)
    scheduler = (AsyncScheduler(**kwargs) if settings is None
                 else PPCadenceScheduler(**kwargs, settings=settings))
    scheduler.use_v2_model_runner = True
    return scheduler


class MRV2Config(VllmConfig):
    """vLLM's config as it is on a GPU, where vLLM runs these models on MRV2."""

    use_v2_model_runner = True


class AcceptingGrammar(StructuredOutputGrammar):
    """A compiled grammar that accepts every token (the schedule is what is under test)."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return tokens

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask, batch_index: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        pass


def make_requests(count: int, rng: random.Random, prompt=(2, 30), output=(5, 40),
                  structured: Callable[[int], bool] = lambda i: False) -> list[Request]:
    """Greedy requests with random prompt and output lengths in the given ranges.

    Requests ``i`` with ``structured(i)`` carry a JSON-schema structured output,
    its grammar already compiled (as the engine core does before scheduling).
    """
    requests = []
    for i in range(count):
        params = SamplingParams(max_tokens=rng.randint(*output), ignore_eos=True)
        if structured(i):
            params.structured_outputs = StructuredOutputsParams(json={"type": "object"})
        request = Request(request_id=str(i), prompt_token_ids=[5] * rng.randint(*prompt),
                          sampling_params=params, pooling_params=None)
        if structured(i):
            request.structured_output_request.grammar = AcceptingGrammar()
        requests.append(request)
    return requests


def sampled_positions(scheduler: AsyncScheduler, output) -> dict[str, int]:
    """The stand-in last stage: each request whose tokens are all computed samples its position.

    A request's output must then read ``prompt_len, prompt_len + 1, ...`` exactly.
    """
    return {rid: scheduler.requests[rid].num_computed_tokens for rid in output.num_scheduled_tokens
            if scheduler.requests[rid].num_computed_tokens >= scheduler.requests[rid].num_tokens}


def drive(scheduler: AsyncScheduler, requests: list[Request], arrivals: list[int],
          on_step: Callable[[object, dict[str, int]], None] | None = None) -> None:
    """Run ``requests`` to completion the way the engine core does under PP.

    ``arrivals[i]`` is the loop step at which request i is added. Up to
    ``pp_size + 1`` batches are in flight; the oldest output is processed once the
    queue is full. ``on_step(output, sampled)`` sees each step as it is scheduled.
    """
    pending = deque(sorted(zip(arrivals, range(len(requests)))))
    in_flight: deque = deque()
    for step in range(3000):
        while pending and pending[0][0] <= step:
            scheduler.add_request(requests[pending.popleft()[1]])
        if scheduler.has_requests():
            output = scheduler.schedule()
            sampled = sampled_positions(scheduler, output)
            if on_step is not None:
                on_step(output, sampled)
            in_flight.append((output, sampled))
            if len(in_flight) < scheduler.pp_size + 1 and scheduler.has_requests():
                continue
        if not in_flight:
            if not pending:
                break
            continue
        output, sampled = in_flight.popleft()
        ids = list(output.num_scheduled_tokens)
        scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[[sampled[rid]] if rid in sampled else [] for rid in ids]))


def wrong_outputs(requests: list[Request]) -> list[str]:
    """Requests whose output is not their positions, each token once (see sampled_positions)."""
    problems = []
    for r in requests:
        expected = list(range(r.num_prompt_tokens, r.num_prompt_tokens + r.max_tokens))
        if list(r.output_token_ids) != expected:
            problems.append(f"request {r.request_id}: {list(r.output_token_ids)}")
    return problems


def pp_engine_config(model_dir: str, pp: int = 2, speculative: str | None = None,
                     connector: str | None = None, async_scheduling: bool = True) -> VllmConfig:
    """A real MRV2 engine config at ``pp`` stages, with a speculative method or a KV
    connector named (only their names: what the plugin's plan reads of them)."""
    config = make_scheduler(model_dir, pp=pp).vllm_config
    if speculative:
        config.speculative_config = type("Spec", (), {"method": speculative,
                                                      "num_speculative_tokens": 3})()
    if connector:
        config.kv_transfer_config = type("KV", (), {"kv_connector": connector})()
    config.scheduler_config.async_scheduling = async_scheduling
    if not async_scheduling:
        from vllm.v1.core.sched.scheduler import Scheduler

        config.scheduler_config.scheduler_cls = Scheduler
    return config
