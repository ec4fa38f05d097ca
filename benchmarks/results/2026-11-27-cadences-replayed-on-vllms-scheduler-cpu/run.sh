#!/usr/bin/env bash
# The commands of this folder, from the repository root, on a 2-core CPU (vLLM 0.33.0):
# each cadence on vLLM's real AsyncScheduler with the plugin's hook, timed on a simulated
# PP=2 pipeline with the recorded one-H200 stage costs (benchmarks/tools/pipeline_sim.py).
set -eu
P="python -m benchmarks.tools.pipeline_sim"
D=benchmarks/results/2026-11-27-cadences-replayed-on-vllms-scheduler-cpu
$P --concurrency 1024 --pass-requests 2048 --out /tmp/c1024 && cp /tmp/c1024/pipeline_sim.json $D/c1024.json
$P --concurrency 256 --pass-requests 1024 --out /tmp/c256 && cp /tmp/c256/pipeline_sim.json $D/c256.json
$P --concurrency 128 --pass-requests 128 --input-len 2 --output-len 512 --out /tmp/burst \
  && cp /tmp/burst/pipeline_sim.json $D/burst-128.json
$P --shape qwen3-0.6b --concurrency 1024 --pass-requests 2048 --out /tmp/small \
  && cp /tmp/small/pipeline_sim.json $D/0.6b-c1024.json
