#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install and
# Ray's (benchmarks/gpu_kit/README.md; bash benchmarks/install_ray.sh .kit/ray/p1, then p2).
set -eu
# Two Ray nodes on one 2x H100 host (ray_nodes.sh: the head owns GPU 0, a second node
# GPU 1), PP=2 with a stage on each: the plugin, then stock, each served at 64 in x
# concurrency 256 (512 requests, 2 passes after a warm-up); then the second node restarted
# on a site without the plugin's package and the plugin served again (0.6B shape).
export VLLM_USE_FLASHINFER_SAMPLER=0
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks2 ray-pp2
# i.e. (RAY_ADDRESS=127.0.0.1:6379)
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy --timeout 600 \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --executor ray --deadline 600 \
#     --out DIR/ray-pp2 --modes plugin:full_and_piecewise,stock:full_and_piecewise \
#     --workload serve --num-requests 512 --output-len 256 --repeat 2 --points 64:256
#   RAY_SECOND_NODE_PYTHONPATH=/tmp/site-without-plugin bash benchmarks/gpu_kit/ray_nodes.sh start
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-0.6b --weights dummy --timeout 300 \
#     --executor ray --deadline 360 --out DIR/ray-missing-package --modes plugin:full_and_piecewise \
#     --workload serve --num-requests 64 --output-len 16 --points 64:16
