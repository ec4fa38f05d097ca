#!/usr/bin/env bash
# 2x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 7fd5a8b,
# under setsid. plan's predictions for these cells were committed first
# (../2026-11-28-predictions-4b-c64-c256-0.6b-c128-cpu/).
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# TP=2, then the plugin's defaults (PP=2); the step's deadline skipped stock (chain.log)
KIT_SMALL_MODEL=qwen3-4b KIT_PAIR_POINTS=64:64,64:256 \
  KIT_PAIR_MODES=tp:full_and_piecewise,plugin:full_and_piecewise,stock:full_and_piecewise \
  KIT_DEADLINE_PAIR_S=720 bash $R <tmp>/p4b serve-pair
# The chain went on to the 0.6B shape at concurrency 128 and was stopped there, before its
# first server had started; then stock PP=2 alone (chain-stock.log)
KIT_SMALL_MODEL=qwen3-4b KIT_PAIR_POINTS=64:64,64:256 KIT_PAIR_MODES=stock:full_and_piecewise \
  KIT_DEADLINE_PAIR_S=600 bash $R <tmp>/p4bs serve-pair
