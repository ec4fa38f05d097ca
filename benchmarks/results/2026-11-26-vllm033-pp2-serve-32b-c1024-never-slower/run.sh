#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md, "The next GPU run"; kit k33c, vLLM 0.33.0).
set -eu

# 1. Two H100s (NVLink), a GPU per stage, one server at a time: the plugin's defaults,
#    stock, the plugin fixed on balance, stock, the plugin again (cut by the deadline).
#    It runs step never-slower-32b, i.e.
#      python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --model qwen3-32b --weights dummy \
#        --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 \
#        --timeout 600 --workload serve --num-requests 2048 --output-len 256 --repeat 2 \
#        --points 64:1024 --deadline 1500 --out DIR/never-slower-32b \
#        --modes plugin:full_and_piecewise,stock:full_and_piecewise,plugin-balance:full_and_piecewise,stock:full_and_piecewise,plugin:full_and_piecewise
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_DEADLINE_S=1500
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks never-slower-32b

# 2. On a 2-core CPU machine, no GPU (vLLM 0.33.0): the scheduler hook's cost per step
#    with 1,024 running requests (scheduler-hook-cost-cpu/).
python benchmarks/tools/scheduler_hook_cost.py --running 1024 --steps 400 --rounds 3 \
  --out scheduler-hook-cost-cpu
