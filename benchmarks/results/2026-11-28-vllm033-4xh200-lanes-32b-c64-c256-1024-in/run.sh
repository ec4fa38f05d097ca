#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md; kit k33c, vLLM 0.33.0), on one host with 4 GPUs (here
# 4x H200), the plugin at commit c1381aa (its code as at 5a73b04; the kit's
# KIT_LANE_REQUESTS added).
set -eu
# lanes-32b serves two servers side by side, lane a on GPUs 0,1 and lane b on GPUs 2,3,
# meeting before each point (plugin | stock, then stock | plugin):
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#     --timeout 600 --workload serve --num-requests 512 --output-len 256 --repeat 2 \
#     --points 64:64,64:256 | 1024:256 --lane-sync DIR/sync --lane a|b --modes ...
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0 \
  KIT_LANE_A=plugin:full_and_piecewise,stock:full_and_piecewise \
  KIT_LANE_B=stock:full_and_piecewise,plugin:full_and_piecewise KIT_LANE_REQUESTS=512
# lanes-32b-64-in/: 933 s
KIT_LANE_POINTS=64:64,64:256 KIT_DEADLINE_S=840 \
  bash benchmarks/gpu_kit/run_checks.sh <tmp>/m1 lanes-32b
# lanes-32b-1024-in/: 652 s
KIT_LANE_POINTS=1024:256 KIT_DEADLINE_S=600 \
  bash benchmarks/gpu_kit/run_checks.sh <tmp>/m2 lanes-32b
