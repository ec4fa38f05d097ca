#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md, "The next GPU run"; kit k33c, vLLM 0.33.0).
set -eu
# Two H100s (NVLink), a GPU per stage, one server at a time: the plugin's defaults, then
# stock. It runs step never-slower-32b, i.e.
#   python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy \
#     --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#     --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#     --points 64:1024 --deadline 720 --out DIR/never-slower-32b \
#     --modes plugin:full_and_piecewise,stock:full_and_piecewise
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_S=720
export KIT_MODES=plugin:full_and_piecewise,stock:full_and_piecewise
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks links ray-pp2 never-slower-32b
