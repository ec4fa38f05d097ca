#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c and Ray 2.60.0 (benchmarks/gpu_kit/README.md,
# benchmarks/install_ray.sh), at 9e8742c, under setsid. Kit and Ray: one part per call, as in
# ../2026-11-27-vllm033-4xh200-pp2-pp4-proofs-faults-ray-last-32b-cost-table/run.sh.
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
cp -a <site> <site-b> && cp -a <site> <site-c>
B=1,32,64,128,256,512,1024
# Side by side: faults-two-nodes/ (the kill case, the plugin's server then stock's; GPUs 0,1),
# the 4B cost table (GPU 2) and its TP=2 shard (GPU 3), each with its own copy of the site.
KIT_TWO_NODE_RUNNERS="plugin stock" KIT_TWO_NODE_HOWS=kill \
  bash $R <tmp>/f2n faults-two-nodes &
KIT_SITE=<site-b> KIT_COST_GPU=2 KIT_COST_SHAPES=qwen3-4b KIT_COST_TP_SHAPES= \
  KIT_COST_BATCHES=$B bash $R <tmp>/ct4 cost-tables &
KIT_SITE=<site-c> KIT_COST_GPU=3 KIT_COST_SHAPES= KIT_COST_TP_SHAPES=qwen3-4b \
  KIT_COST_BATCHES=$B bash $R <tmp>/ct4tp cost-tables &
wait
# Then on all four GPUs: the 4B shape at concurrency 256 and 1,024, the plugin's defaults
# beside stock in both lane orders (four API servers per engine).
KIT_SMALL_MODEL=qwen3-4b KIT_DEADLINE_API_S=840 KIT_API_POINTS=64:256,64:1024 \
  bash $R <tmp>/l4b lanes-0.6b-api
