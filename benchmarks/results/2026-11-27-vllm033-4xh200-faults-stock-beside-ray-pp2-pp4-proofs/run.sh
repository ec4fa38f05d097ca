#!/usr/bin/env bash
# 4x H200 (NVLink), vLLM 0.33.0 through the GPU kit k33c, Ray 2.60.0, the plugin at
# b619646 (ad924d4's runner plus the kit's KIT_FAULT_CASES). One call per line group,
# back to back.
set -eu
bash .kit/k33c/part-1/install.sh && nvidia-smi -L
bash .kit/k33c/part-2/install.sh
bash .kit/k33c/part-3/install.sh
bash .kit/k33c/part-4/install.sh
bash benchmarks/install_ray.sh .kit/ray/p1
bash .kit/k33c/part-5/install.sh
bash benchmarks/install_ray.sh .kit/ray/p2
export VLLM_USE_FLASHINFER_SAMPLER=0
# Faults: the plugin on GPUs 0,1 beside stock on 2,3, five cases each, in this order.
KIT_FAULT_CASES="ray:first:raise ray:last:raise mp:last:raise ray:last:kill mp:first:raise" \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks faults
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 540
# Two workers of the plugin's mp last-stage raise were still holding GPUs 0,1 (59 GB
# each, 7 minutes on); they were killed by hand before the proofs:
nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
# Token proofs with a GPU per rank: PP=2 in three graph modes, then PP=4 in one.
T=tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode
KIT_TESTS="--graph-modes=full_and_piecewise,breakable,eager $T[pp2]" \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/g2 gpu-tests
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/g2 900
KIT_TESTS="--graph-modes=full_and_piecewise $T[pp4]" \
  bash benchmarks/gpu_kit/run_checks.sh start /tmp/g4 gpu-tests
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/g4 540
