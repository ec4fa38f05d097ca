#!/usr/bin/env bash
# On the GPU machine after the kit's install: stock once, then the plugin three times,
# each a fresh smoke.py (engine core in its own process, as by default), FULL_AND_PIECEWISE,
# random weights. Results in DIR/{stock,plugin-N}/smoke.json and .log.
set -u
dir=${1:?usage: repeat.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
smoke=$here/../../gpu_kit/smoke.py
export PYTHONPATH=${KIT_SITE:-/tmp/site} PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for run in stock plugin-1 plugin-2 plugin-3; do
  plugins=""; [ "$run" != stock ] && plugins=pp_cudagraph
  VLLM_PLUGINS=$plugins timeout -k 10 300 python3 "$smoke" --random-weights "$dir/$run" \
    full_and_piecewise >"$dir/$run.log" 2>&1
  echo "$run rc=$? $(grep -h '^RESULT' "$dir/$run.log" | cut -c1-200)"
done
echo REPEAT DONE
