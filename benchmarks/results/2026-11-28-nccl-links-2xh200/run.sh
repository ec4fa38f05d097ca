#!/usr/bin/env bash
# 2x H200 host (NVLink), after the GPU kit's install (benchmarks/gpu_kit/README.md: k33c,
# five calls), at 607fdc2. Step links of run_checks.sh, i.e.
#   python3 -m benchmarks.tools.link_bench --out DIR/links
set -eu
export VLLM_USE_FLASHINFER_SAMPLER=0
bash benchmarks/gpu_kit/run_checks.sh <tmp>/links links
