#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 2f5e92c, every rank
# on the one GPU (benchmarks/gpu_kit/shared_gpu/): tokens and behaviour only, no speed.
export VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# First, two kit runs at once on the GPU (started under setsid): the graph-mode proofs on a
# copy of the kit's site (shared-batch-0.6b/, shared-modes-0.6b/, summary-beside.txt) beside
# the LoRA soak test (shared-lora/). Two jobs on one GPU is what the kit README now warns
# against: see README.md here.
cp -a /tmp/site /tmp/site-b
KIT_SITE=/tmp/site-b VLLM_PORT=29700 bash $R /tmp/b shared-batch shared-modes > /tmp/b.log 2>&1 &
bash $R /tmp/a shared-lora > /tmp/a.log 2>&1
wait
# Then, on a fresh machine with nothing else on the GPU (alone-fap-0.6b/):
python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade --target /tmp/site .
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=benchmarks/gpu_kit/shared_gpu:/tmp/site KIT_SHARED_GPU_STAGES=2 \
  python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --workload batch --model qwen3-0.6b \
  --weights random --repeat 1 --timeout 300 --deadline 320 --out alone-fap-0.6b \
  --modes stock:full_and_piecewise,plugin:full_and_piecewise
