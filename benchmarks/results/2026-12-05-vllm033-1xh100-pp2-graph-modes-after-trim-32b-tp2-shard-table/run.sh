#!/usr/bin/env bash
# One H100, vLLM 0.33.0 from the kit (benchmarks/gpu_kit/README.md: prepare.sh 0.33.0, each
# part's install.sh), the project at 6f1dc6a. Steps run in run_checks.sh's order:
# shared-stuck-stage, cost-tables, shared-layouts, one after another.
# shared-layouts: every rank on the one GPU (benchmarks/gpu_kit/shared_gpu/), tokens and
# behaviour only. cost-tables: the GPU to itself.
T=tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode
export KIT_SHARED_GPU_KV_GIB=1 KIT_STUCK_STOCK=0 KIT_COST_SHAPES= KIT_COST_TP_SHAPES=qwen3-32b
export KIT_LAYOUT_STREAM_1="--graph-modes=piecewise $T[pp2]"
export KIT_LAYOUT_STREAM_2="--graph-modes=full_decode_only $T[pp2]"
export KIT_LAYOUT_STREAM_3="--graph-modes=eager $T[pp2]"
export KIT_LAYOUT_STREAM_4="--graph-modes=breakable $T[pp2]"
bash benchmarks/gpu_kit/run_checks.sh start /tmp/go/checks cost-tables shared-layouts shared-stuck-stage
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/go/checks 500
# process-lines.txt: from each plugin engine's log,
#   grep -h "vllm-pp-cudagraph active\|Using custom scheduler class" plugin-MODE.log
# The KV cap of the first line reached the stuck-stage step too, which cannot then start
# its servers; run_checks.sh now takes the layouts' cap as KIT_LAYOUT_KV_GIB alone.
