#!/usr/bin/env bash
# 2x H200 host, vLLM 0.33.0 from kit k33c and Ray 2.60.0 (benchmarks/gpu_kit/README.md,
# benchmarks/install_ray.sh), at 4ca16bf, under setsid, one after another:
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# faults-two-nodes/: two Ray nodes on this host (head on GPU 0, second node on GPU 1),
# the plugin's PP=2 server under load; the second node's stage raises, then (a new
# server) its worker is killed (5.5 minutes)
bash $R <tmp>/f2n faults-two-nodes
# soak-preemption-32b/: the plugin, stock_a, stock_b one after another on GPUs 0,1, a KV
# cache of 512 blocks, 2,000 requests each, then the token check (19 minutes)
KIT_SOAK_GROUPS=0,1 bash $R <tmp>/spre soak-preemption-32b
# Stock's server in the two-node kill case was queued after the soak and did not run.
