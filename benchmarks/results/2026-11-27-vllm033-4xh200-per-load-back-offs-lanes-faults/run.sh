#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md; kit k33c, vLLM 0.33.0), on one host with 4 GPUs (here
# 4x H200), the plugin at commit f7bae73 (auto's per-load back-offs).
set -eu
# lanes-32b and lanes-0.6b-api each serve two servers side by side, lane a on GPUs 0,1
# and lane b on GPUs 2,3, meeting before each point (plugin | stock, then stock | plugin):
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b|qwen3-0.6b --weights dummy \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#     --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#     --points 64:1024 --lane-sync DIR/sync --lane a|b --modes ...
# lanes-0.6b-api adds --api-server-count 4 (KIT_API_SERVERS).
# faults: python3 -m benchmarks.tools.serve_checks fault --runner plugin|stock \
#   --stage first|last --how raise|kill, the plugin on GPUs 0,1 beside stock on 2,3.
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_API_POINTS=64:1024 KIT_DEADLINE_API_S=480 \
  KIT_LANE_A=plugin:full_and_piecewise,stock:full_and_piecewise \
  KIT_LANE_B=stock:full_and_piecewise,plugin:full_and_piecewise KIT_DEADLINE_S=840
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks lanes-0.6b-api lanes-32b faults
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 570   # repeated until CHECKS DONE
# The run was stopped 4 minutes into faults: three of its eight runs finished.
