#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md; kit k33c, vLLM 0.33.0), on one host with 4 GPUs (here
# 4x H200), the plugin at commit b672fae.
set -eu
# Each step serves two servers side by side, lane a on GPUs 0,1 and lane b on GPUs 2,3,
# meeting before each point; the k-th runner of each lane is served in the same minutes:
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model MODEL --weights dummy \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#     --timeout 600 --workload serve ... --lane-sync DIR/sync --lane a|b --modes ...
# lanes-32b:       qwen3-32b, --num-requests 2048 --output-len 256 --repeat 2 --points 64:1024
# lanes-burst-32b: qwen3-32b, --num-requests 128 --output-len 512 --repeat 3 --points 2:128
# lanes-0.6b:      qwen3-0.6b, --num-requests 2048 --output-len 256 --repeat 2 --points 64:1024
# The burst and 0.6B steps name plugin | stock then stock | plugin; their deadlines left
# room for the first slot only.
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_S=720 KIT_DEADLINE_BURST_S=420 KIT_DEADLINE_SMALL_S=400
export KIT_LANE_A=plugin:full_and_piecewise,stock:full_and_piecewise
export KIT_LANE_B=stock:full_and_piecewise,plugin:full_and_piecewise
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks lanes-32b lanes-burst-32b lanes-0.6b
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 540   # repeated until ALL STEPS DONE
