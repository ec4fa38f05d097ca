#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at ed629d6
# (the last code change), under setsid: the two proofs side by side, one per GPU pair,
# then the two served cells one after the other.
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
T="tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode[pp2]"
# layouts/: PIECEWISE on GPUs 0,1 and FULL_DECODE_ONLY on 2,3 (the second 45 s later,
# with its own VLLM_PORT base and compile cache)
CUDA_VISIBLE_DEVICES=0,1 VLLM_PORT=29500 KIT_TESTS="--graph-modes=piecewise $T" \
  bash $R <tmp>/g2pw gpu-tests &
sleep 45
CUDA_VISIBLE_DEVICES=2,3 VLLM_PORT=29700 VLLM_CACHE_ROOT=<tmp>/vc2 \
  KIT_TESTS="--graph-modes=full_decode_only $T" bash $R <tmp>/g2fdo gpu-tests &
wait
# lanes-0.6b-c256/: the plugin's defaults beside stock, then the GPU pairs swapped
KIT_DEADLINE_API_S=500 KIT_API_POINTS=64:256 bash $R <tmp>/c256 lanes-0.6b-api
# lanes-4b-c64/: the same on the 4B shape; the deadline ended it after the first slot
KIT_SMALL_MODEL=qwen3-4b KIT_DEADLINE_API_S=400 KIT_API_POINTS=64:64 \
  bash $R <tmp>/c64-4b lanes-0.6b-api
