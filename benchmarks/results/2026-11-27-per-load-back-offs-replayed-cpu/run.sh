#!/usr/bin/env bash
# The replay of ../2026-11-27-cadences-replayed-on-vllms-scheduler-cpu/ with auto's
# per-load back-offs (the plugin at commit 1e29f8b or later), vLLM 0.33.0, on a CPU.
set -eu
P="python -m benchmarks.tools.pipeline_sim"
D=benchmarks/results/2026-11-27-per-load-back-offs-replayed-cpu
$P --concurrency 1024 --pass-requests 2048 --out /tmp/sim/c1024 && cp /tmp/sim/c1024/pipeline_sim.json $D/c1024.json
$P --shape qwen3-0.6b --concurrency 1024 --pass-requests 2048 --out /tmp/sim/small \
  && cp /tmp/sim/small/pipeline_sim.json $D/0.6b-c1024.json
$P --concurrency 128 --pass-requests 128 --input-len 2 --output-len 512 --out /tmp/sim/burst \
  && cp /tmp/sim/burst/pipeline_sim.json $D/burst-128.json
