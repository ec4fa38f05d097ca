"""Decode groups over MRV2's PP cadence, on vLLM's real AsyncScheduler."""

from __future__ import annotations

from collections import deque

import pytest


@pytest.fixture
def make_scheduler(monkeypatch, tmp_path):
    import torch
    import vllm.config.vllm as vllm_config_module
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from vllm_pp_cudagraph.dummy_model import write_model_dir

    # CPU machine: MRV2's config check wants Triton with a driver.
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    model_dir = str(write_model_dir(tmp_path))

    def make(pp_size: int, max_num_seqs: int):
        config = VllmConfig(
            model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=1024),
            device_config=DeviceConfig(device="cpu"),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=1024,
                max_model_len=1024,
                async_scheduling=True,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(block_size=16),
            parallel_config=ParallelConfig(pipeline_parallel_size=pp_size),
        )
        config.cache_config.num_gpu_blocks = 1000
        kv = KVCacheConfig(
            num_blocks=1000,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(
                        block_size=16, num_kv_heads=1, head_size=16, dtype=torch.float16
                    ),
                )
            ],
        )
        return AsyncScheduler(config, kv, StructuredOutputManager(config), block_size=16)

    return make


@pytest.fixture
def balancing():
    from vllm_pp_cudagraph.patches import PATCHES
    from vllm_pp_cudagraph.settings import PPCudaGraphSettings

    patch = next(p for p in PATCHES if p.name == "decode-balance")
    undo = patch.apply(PPCudaGraphSettings(balance_decodes=True))
    yield
    undo()


def run(scheduler, num_requests: int, max_tokens: int):
    """Drive the scheduler like the engine core's batch queue (pp_size + 1 in flight).

    Returns the requests scheduled at each step and each request's output length.
    """
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    requests = [
        Request(
            request_id=str(i),
            prompt_token_ids=[5, 6],
            sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
            pooling_params=None,
        )
        for i in range(num_requests)
    ]
    for request in requests:
        scheduler.add_request(request)
    in_flight, steps = deque(), []
    for _ in range(20 * max_tokens):
        out = scheduler.schedule()
        steps.append(sorted(out.num_scheduled_tokens, key=int))
        in_flight.append(out)
        if len(in_flight) == scheduler.pp_size + 1 or not scheduler.has_requests():
            done = in_flight.popleft()
            ids = list(done.num_scheduled_tokens)
            scheduler.update_from_output(
                done,
                ModelRunnerOutput(
                    req_ids=ids,
                    req_id_to_index={r: k for k, r in enumerate(ids)},
                    sampled_token_ids=[[7] for _ in ids],
                ),
            )
        if not scheduler.has_requests() and not in_flight:
            break
    return steps, {r.request_id: r.num_output_tokens for r in requests}


def busy_steps(steps):
    """The steps between the first and the last that ran anything."""
    first = next(i for i, s in enumerate(steps) if s)
    last = max(i for i, s in enumerate(steps) if s)
    return steps[first : last + 1]


def test_stock_cadence_leaves_every_other_step_empty(make_scheduler):
    """What the balancing is for: vLLM's own scheduler at PP=2, all requests together."""
    steps, outputs = run(make_scheduler(pp_size=2, max_num_seqs=16), 16, max_tokens=8)
    sizes = [len(s) for s in busy_steps(steps)]
    assert sizes[:6] == [16, 0, 16, 0, 16, 0]
    assert set(outputs.values()) == {8}


@pytest.mark.parametrize("pp_size", [2, 3, 4])
def test_balanced_groups_fill_every_step(make_scheduler, balancing, pp_size):
    steps, outputs = run(make_scheduler(pp_size=pp_size, max_num_seqs=12), 12, max_tokens=10)
    sizes = [len(s) for s in busy_steps(steps)]
    # After the prefill step the requests are spread over the cycle: every step of
    # the steady state runs 12 / pp_size of them.
    steady = sizes[pp_size : pp_size + 3 * pp_size]
    assert steady == [12 // pp_size] * len(steady), sizes
    assert set(outputs.values()) == {10}  # nobody starves or loses a token


@pytest.mark.parametrize("pp_size", [2, 4])
def test_a_request_never_decodes_sooner_than_pp_size_steps_after_its_last(
    make_scheduler, balancing, pp_size
):
    """The non-last stages learn a sampled token pp_size steps later; never sooner."""
    steps, _ = run(make_scheduler(pp_size=pp_size, max_num_seqs=10), 13, max_tokens=7)
    last_seen: dict[str, int] = {}
    for index, scheduled in enumerate(steps):
        for req_id in scheduled:
            if req_id in last_seen:
                assert index - last_seen[req_id] >= pp_size, (req_id, last_seen[req_id], index)
            last_seen[req_id] = index


def test_late_arrivals_join_the_smaller_group(make_scheduler, balancing):
    scheduler = make_scheduler(pp_size=2, max_num_seqs=16)
    run(scheduler, 6, max_tokens=3)  # an earlier wave, finished
    steps, outputs = run(scheduler, 7, max_tokens=6)
    sizes = [len(s) for s in busy_steps(steps)]
    assert max(sizes[2:6]) - min(sizes[2:6]) <= 1, sizes
    assert set(outputs.values()) == {6}


def test_undo_restores_vllms_method():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_pp_cudagraph.patches import PATCHES
    from vllm_pp_cudagraph.settings import PPCudaGraphSettings

    original = AsyncScheduler.__dict__["_update_after_schedule"]
    patch = next(p for p in PATCHES if p.name == "decode-balance")
    assert patch.apply(PPCudaGraphSettings()) is None  # off by default: nothing changes
    undo = patch.apply(PPCudaGraphSettings(balance_decodes=True))
    assert AsyncScheduler.__dict__["_update_after_schedule"] is not original
    undo()
    assert AsyncScheduler.__dict__["_update_after_schedule"] is original
