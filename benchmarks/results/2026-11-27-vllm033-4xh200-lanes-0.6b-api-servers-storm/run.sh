#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md; kit k33c, vLLM 0.33.0), on one host with 4 GPUs (here
# 4x H200), the plugin at commit e9098a8.
set -eu
# lanes-0.6b and lanes-0.6b-api each serve two servers side by side, lane a on GPUs 0,1
# and lane b on GPUs 2,3, meeting before each point (plugin | stock, then stock | plugin):
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-0.6b --weights dummy \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#     --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#     --points 64:1024 --lane-sync DIR/sync --lane a|b --modes ...
# lanes-0.6b-api adds --api-server-count 4 (KIT_API_SERVERS).
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_SMALL_S=800 KIT_DEADLINE_API_S=720
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks lanes-0.6b lanes-0.6b-api
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 520   # repeated until ALL STEPS DONE
# Then, on the same host:
#   python3 -m benchmarks.tools.serve_storm --out DIR/storm --runner plugin|stock --pp 2|4 ...
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks storm
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 560   # repeated until ALL STEPS DONE
