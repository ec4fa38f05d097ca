#!/usr/bin/env bash
# The runs behind this folder, on one host with 2 GPUs: vLLM 0.26.0 and this package
# installed from wheels into the directory SITE_DIR names (benchmarks/README.md,
# "Offline hosts"). Each cell is one bench invocation: the plugin's defaults, stock
# MRV2 (and V1 in some cells) side by side, FULL_AND_PIECEWISE,
# TRITON_ATTN, dummy weights.
#   SITE_DIR=DIR bash run.sh OUT CELL...    CELL in engine-32b, engine-0.6b, serve-32b
set -uo pipefail
out=${1:?usage: run.sh OUT CELL...}; shift
export PYTHONPATH=${SITE_DIR:?set SITE_DIR} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bench() { python3 -m vllm_pp_cudagraph.bench --pp 2 --weights dummy "$@"; }
fp=full_and_piecewise
for cell in "$@"; do
  case $cell in
    engine-32b)
      bench --model qwen3-32b --workload engine --prompts 256 --input-len 64 --output-len 256 \
        --max-num-seqs 256 --repeat 3 --profile --out "$out/$cell" \
        --modes plugin-balance:$fp,stock:$fp,plugin:$fp ;;
    engine-0.6b)
      bench --model qwen3-0.6b --workload engine --prompts 128 --input-len 2 --output-len 512 \
        --max-num-seqs 128 --repeat 3 --profile --out "$out/$cell" \
        --modes plugin:$fp,stock:$fp,v1:$fp ;;
    serve-32b)
      bench --model qwen3-32b --workload serve --num-requests 512 --input-len 64 --output-len 256 \
        --max-num-seqs 256 --concurrency 64,256 --repeat 2 --profile --out "$out/$cell" \
        --modes plugin:$fp,stock:$fp,v1:$fp ;;
    *) echo "unknown cell $cell" >&2 ;;
  esac 2>&1 | tee "$out/$cell.txt"
done
