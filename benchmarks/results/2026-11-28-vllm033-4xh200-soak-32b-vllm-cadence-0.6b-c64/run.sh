#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 909604f plus
# the two kit options this run added (KIT_SOAK_ARGS; soak.py's --no-token-check), one
# after another under setsid:
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# soak-32b/: the plugin on vLLM's cadence on GPUs 0,1 beside stock on 2,3, then a second
# stock server on 2,3; 4,000 requests a server, no token check
KIT_SOAK_PLUGIN_RUNNER=plugin-cadence KIT_SOAK_REQUESTS=4000 KIT_SOAK_ARGS=--no-token-check \
  bash $R <tmp>/s soak-32b
# lanes-0.6b-api/: the plugin's defaults beside stock, then the GPU pairs swapped
KIT_DEADLINE_API_S=500 KIT_API_POINTS=64:64 bash $R <tmp>/c64 lanes-0.6b-api
