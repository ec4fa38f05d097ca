#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at d30a2be,
# under setsid:
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# soak-32b-pp4/: the plugin, then two stock servers, one at a time on GPUs 0-3 (24 minutes
# for the three), then the token check (stopped after 4 minutes)
bash $R /tmp/soak soak-32b-pp4
# soak.json: the verdict from the three saved servers, on this machine, without the token
# check (soak.py at the commit that added the stalls; these servers ran without vLLM's
# --jit-monitor-verbose, which soak.py now passes):
python -c "
import sys, benchmarks.tools.soak as s
s.jit_monitor_args = lambda: []
sys.exit(s.main('--out soak-32b-pp4 --pp 4 --gpus 0,1,2,3 --modes full_and_piecewise \
  --sampling-mix --structured --no-token-check --requests 10000 \
  --gpu-memory-utilization 0.9 --port 9800 --plugin-runner plugin --resume \
  --shape qwen3-32b --lora 1'.split()))"
