#!/usr/bin/env bash
# PP=2 with both stages on GPU 0: FULL on the 0.6B shape, then the 30B-A3B MoE shape.
export CUDA_VISIBLE_DEVICES=0 KIT_SHARED_GPU_STAGES=2 PYTHONPATH="$PWD/benchmarks/gpu_kit/shared_gpu:${KIT_SITE:-/tmp/site}" \
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
D=${1:?usage: more.sh DIR}; mkdir -p "$D"
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target ${KIT_SITE:-/tmp/site} . 2>&1 | grep -v 'already exists'
python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --workload batch --model qwen3-0.6b --weights random \
  --repeat 1 --timeout 240 --deadline 330 --out "$D"/full-0.6b --modes stock:full,plugin:full
python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --workload batch --model qwen3-30b-a3b --weights dummy \
  --prompts 64 --input-len 32 --output-len 128 --max-num-seqs 64 --repeat 1 --timeout 300 --deadline 600 \
  --out "$D"/moe-30b-a3b --modes stock:piecewise,plugin:piecewise,plugin:full_decode_only
echo MORE DONE
