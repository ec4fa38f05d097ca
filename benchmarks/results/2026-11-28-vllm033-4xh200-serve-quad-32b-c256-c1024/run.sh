#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 3fc778a, under
# setsid. Kit: one part per call, as in
# ../2026-11-28-vllm033-4xh200-two-node-kill-4b-cost-table-lanes-4b-c256-c1024/run.sh.
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh

# First chain: every layout of four GPUs, one after another on GPUs 0-3, at both loads.
KIT_QUAD_POINTS=64:256,64:1024 KIT_DEADLINE_QUAD_S=780 bash $R <tmp>/quad serve-quad

# The plugin at PP=4 took 485 s for its two loads, so the chain was cut short. A second chain cut the first once stock PP=4's second c256 pass
# was written (stock's c1,024 passes did not run), then served the rest at c256 only.
S=<tmp>/quad/serve-quad-qwen3-32b-pp4/stock-full_and_piecewise-results/in64-c256-1.json
while [ ! -s $S ]; do sleep 3; done
kill -TERM -- -"$(ps -eo pgid=,args= | awk '$2=="bash" && $3==".kit/chain.sh" {print $1; exit}')"
sleep 20
for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do kill -9 "$p"; done
KIT_QUAD_PP4_MODES=tp:full_and_piecewise KIT_QUAD_TP2PP2_MODES=plugin:full_and_piecewise \
  KIT_QUAD_POINTS=64:256 KIT_DEADLINE_QUAD_S=330 bash $R <tmp>/quad2 serve-quad
# TP=4's server took 5 minutes to start (init 225 s, of which compilation 69 s) and the
# 330 s deadline stopped it before its first pass; the plugin at TP=2 x PP=2 finished its
# warm-up and one timed pass before the run was stopped.
