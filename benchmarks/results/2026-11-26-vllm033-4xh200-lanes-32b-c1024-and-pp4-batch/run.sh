#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md, "The next GPU run"; kit k33c, vLLM 0.33.0), on one host
# with 4 GPUs (here 4x H200, NVLink NV18 between every pair).
set -eu
# batch-pp4: PP=4, a GPU per rank, the Qwen3-0.6B shape (random weights), --workload batch
#   (128 prompts of 2 tokens, 512 out), stock then the plugin, FULL_AND_PIECEWISE then
#   PIECEWISE, within KIT_DEADLINE_PP4_S seconds in all.
# lanes-32b: two servers side by side, lane a on GPUs 0,1 and lane b on GPUs 2,3, meeting
#   before each point; the k-th runner of each lane is served in the same minutes:
#     python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy \
#       --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#       --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#       --points 64:1024 --deadline 1140 --lane-sync DIR/sync --lane a|b --modes ...
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_PP4_S=300 KIT_DEADLINE_S=1140
export KIT_LANE_A=plugin:full_and_piecewise,stock:full_and_piecewise,plugin-balance:full_and_piecewise
export KIT_LANE_B=stock:full_and_piecewise,plugin:full_and_piecewise,stock:full_and_piecewise
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks batch-pp4 lanes-32b
