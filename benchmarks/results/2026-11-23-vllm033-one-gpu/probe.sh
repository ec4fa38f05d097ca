#!/usr/bin/env bash
# On the GPU machine after the kit's install (../../gpu_kit/README.md): each variant
# twice or once, in fresh processes, one GPU. Writes DIR/probe-*.json and logs.
set -u
dir=${1:?usage: probe.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
export PYTHONPATH=${KIT_SITE:-/tmp/site} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for run in stock-1 plugin-1 plugin-vllm-manager-1 stock-2 plugin-2; do
  timeout -k 10 300 python3 "$here/full_graph_probe.py" "$dir/probe-$run.json" "${run%-*}" \
    >"$dir/probe-$run.log" 2>&1
  echo "$run rc=$? $(grep -h '^PROBE' "$dir/probe-$run.log" | cut -c1-400)"
done
echo PROBES DONE
