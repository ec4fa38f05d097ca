#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 739d5d4, every rank
# on the one GPU (benchmarks/gpu_kit/shared_gpu/): tokens and behaviour only, no speed.
# Each step alone on the GPU, under setsid.
export VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# shared-soak-32b-pp4/: the 32B LoRA soak at PP=4, 1,000 requests a server (the plugin, then
# two stock servers), every kernel's first launch while serving logged
bash $R /tmp/a shared-soak-32b-pp4
# shared-modes-0.6b/: PP=2 greedy tokens in FULL_DECODE_ONLY, eager, breakable and the
# direct hand-off in eager, Qwen3-0.6B shape, random weights
bash $R /tmp/m shared-modes
