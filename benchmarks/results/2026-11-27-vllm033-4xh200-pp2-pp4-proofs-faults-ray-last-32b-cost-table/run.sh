#!/usr/bin/env bash
# 4x H200 (NVLink), vLLM 0.33.0 through the GPU kit k33c, the plugin at 21911f4 plus the
# kit's KIT_COST_BATCHES (committed in eb24a00). One call per line group, back to back.
set -eu
# Kit and Ray, one part per call:
bash .kit/k33c/part-1/install.sh && nvidia-smi -L
bash .kit/k33c/part-2/install.sh
bash .kit/k33c/part-3/install.sh
bash .kit/k33c/part-4/install.sh
bash benchmarks/install_ray.sh .kit/ray/p1
bash .kit/k33c/part-5/install.sh
bash benchmarks/install_ray.sh .kit/ray/p2
# Two runs side by side: the 32B cost table on GPU 0; Ray faults and the PP=2 layout
# proof on GPUs 2,3 (a copy of the kit's site, so the two project installs do not meet).
cp -a /tmp/site /tmp/site-b
export VLLM_USE_FLASHINFER_SAMPLER=0
KIT_COST_SHAPES=qwen3-32b KIT_COST_TP_SHAPES=qwen3-32b \
  KIT_COST_BATCHES=1,32,64,128,256,512,1024 \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/ct cost-tables
CUDA_VISIBLE_DEVICES=2,3 VLLM_PORT=29800 KIT_SITE=/tmp/site-b \
  KIT_TESTS="tests/tools/test_serving_gpu.py::test_a_stage_fault_under_ray_stops_the_server_promptly_leaving_nothing tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode[pp2]" \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/g2 gpu-tests
# Then, on all four GPUs: the last stage's faults under mp (the plugin on 0,1 beside
# stock on 2,3), then PP=4 with a GPU per rank in two graph modes.
KIT_FAULT_EXECUTORS=mp KIT_FAULT_STAGES=last \
  KIT_TESTS="--graph-modes=full_and_piecewise,eager tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode[pp4]" \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/p4 faults gpu-tests
# Each run polled with: bash benchmarks/gpu_kit/run_checks.sh wait DIR SECONDS
