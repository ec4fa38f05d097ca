#!/usr/bin/env bash
# From the repository root, after the GPU kit's install (benchmarks/gpu_kit/README.md);
# 2 GPUs. Step links of run_checks.sh, i.e.
#   python3 -m benchmarks.tools.link_bench --out DIR/links
set -eu
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks links
