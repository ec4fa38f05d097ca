#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at cb878ea,
# one after another under setsid:
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# faults/: the engine core killed under load, the plugin on GPUs 0,1 beside stock on 2,3
KIT_FAULT_CASES="mp:first:kill-engine" bash $R /tmp/r/f faults
# soak-32b/: the plugin on GPUs 0,1 beside stock on 2,3, then a second stock server on
# 0,1 and the token check
KIT_SOAK_REQUESTS=10000 bash $R /tmp/r/s soak-32b
# (lanes-0.6b-api, which followed, was stopped at once)
#
# The soak's memory verdict again, with the rule as it stands after this run (the
# settled baseline and the comparison with stock), from the saved server reports
# (server-*.json here keep each server's watch), run in soak-32b/ with the repository
# root on PYTHONPATH; it prints no problem for any server:
python3 -c '
import json, sys
from benchmarks.tools.soak_watch import first_traffic_problems, watch_problems
w = {n: json.load(open(f"server-{n}.json"))["watch"] for n in ("plugin", "stock-a", "stock-b")}
print({n: watch_problems(x, n == "plugin") for n, x in w.items()},
      first_traffic_problems(w["plugin"], w["stock-a"]))'
