#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at 96c5f96, in the
# last device-minutes of a session: the 4B cost table without the TP shard. The call
# ended (its time limit) while the 12-layer stage was still starting, so no table was
# fitted; the 4-layer stage's rows are kept.
export PYTHONPATH=<site> VLLM_USE_FLASHINFER_SAMPLER=0
KIT_COST_SHAPES=qwen3-4b KIT_COST_TP_SHAPES= bash benchmarks/gpu_kit/run_checks.sh <tmp>/ct cost-tables
