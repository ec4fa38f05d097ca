#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md; kit k33c, vLLM 0.33.0), on one host with 4 GPUs (here
# 4x H200, NVLink NV18 between every pair), the plugin at commit 8c7f6b5.
set -eu
# lanes-32b: two servers side by side, lane a on GPUs 0,1 and lane b on GPUs 2,3, meeting
#   before each point; the k-th runner of each lane is served in the same minutes:
#     python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy \
#       --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#       --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#       --points 64:1024 --deadline 1500 --lane-sync DIR/sync --lane a|b --modes ...
# plugin-cadence: VLLM_PP_CUDAGRAPH_DECODE_CADENCE=vllm (the scheduler hook stands aside);
# plugin-cadence-kvsplit: the same and VLLM_PP_CUDAGRAPH_KV_UPDATE_IN_GRAPHS=0.
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_S=1500
export KIT_LANE_A=plugin-cadence:full_and_piecewise,stock:full_and_piecewise,plugin-cadence-kvsplit:full_and_piecewise,stock:full_and_piecewise
export KIT_LANE_B=stock:full_and_piecewise,plugin-cadence:full_and_piecewise,stock:full_and_piecewise,plugin-cadence-kvsplit:full_and_piecewise
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks lanes-32b
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 540   # repeated until ALL STEPS DONE
