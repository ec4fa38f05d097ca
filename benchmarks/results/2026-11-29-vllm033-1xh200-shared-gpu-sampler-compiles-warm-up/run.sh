#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), every rank on the one
# GPU (benchmarks/gpu_kit/shared_gpu/): tokens and behaviour only, no speed. Under setsid.
export VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# At 006f043: shared-batch-0.6b/ (greedy tokens per graph mode, each timed pass after
# vLLM's prefix cache was emptied) and shared-soak-32b-pp4/ (the 32B LoRA soak at PP=4,
# 1,000 requests a server: the plugin, then two stock servers; every kernel compiled while
# serving, by rank and time)
bash $R /tmp/s1 shared-batch shared-soak-32b-pp4
# At 36ed02d's runner and compat change (sampler-warm-up/; run before that commit's guard
# for releases without vLLM's registration was added): the plugin at PP=2, 0.6B shape,
# after the kit's site got the project
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/site .
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=benchmarks/gpu_kit/shared_gpu:/tmp/site KIT_SHARED_GPU_STAGES=2 \
  python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --workload batch --model qwen3-0.6b \
  --weights dummy --prompts 16 --input-len 8 --output-len 8 --repeat 1 --timeout 160 \
  --out sampler-warm-up --modes plugin:full_and_piecewise
