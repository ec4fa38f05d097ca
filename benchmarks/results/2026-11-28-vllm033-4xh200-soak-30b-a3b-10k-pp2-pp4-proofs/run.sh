#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 639bbab,
# under setsid, one after another:
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
T=tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode
# soak-30b-a3b/: the plugin on GPUs 0,1 beside stock on 2,3, then a second stock server
# on 0,1 and the token check (14.6 minutes)
KIT_SOAK_REQUESTS=10000 bash $R /tmp/s soak-30b-a3b
# layouts/pp2-*: PP=2, FULL_AND_PIECEWISE, a GPU per rank (5 minutes)
CUDA_VISIBLE_DEVICES=0,1 KIT_TESTS="--graph-modes=full_and_piecewise $T[pp2]" \
  bash $R /tmp/g2 gpu-tests
# layouts/pp4-*: PP=4 (vLLM's split), FULL_AND_PIECEWISE, a GPU per rank (4.5 minutes)
CUDA_VISIBLE_DEVICES=0,1,2,3 KIT_TESTS="--graph-modes=full_and_piecewise $T[pp4]" \
  bash $R /tmp/g4 gpu-tests
