#!/usr/bin/env bash
# The commands of this folder, from the repository root, after the GPU kit's install
# (benchmarks/gpu_kit/README.md, "The next GPU run"; kit k33d, vLLM 0.33.0).
set -eu

# 1. Two H200s: what the metrics cost (a GPU per stage), then the plan's GPU proofs,
#    every rank of each engine on one GPU through the test-only shim, four pytest runs
#    side by side (two on each GPU).
export VLLM_USE_FLASHINFER_SAMPLER=0 KIT_LAYOUT_GPUS="0 1 0 1" L=tests/e2e/test_layouts.py
export KIT_LAYOUT_STREAM_1="--graph-modes=full_and_piecewise,piecewise,full_decode_only $L::test_layout_serves_stocks_tokens_in_every_graph_mode[pp2]"
export KIT_LAYOUT_STREAM_2="--graph-modes=full_and_piecewise $L::test_layout_serves_stocks_tokens_in_every_graph_mode[pp4] $L::test_layout_serves_stocks_tokens_in_every_graph_mode[tp2xpp2]"
export KIT_LAYOUT_STREAM_3="--graph-modes=eager,breakable $L::test_layout_serves_stocks_tokens_in_every_graph_mode[pp2] tests/e2e/test_pp_engine.py::test_speculative_decoding_serves_with_the_tokens_of_a_stock_engine[eagle3]"
export KIT_LAYOUT_STREAM_4="tests/e2e/test_metrics_serve.py::test_serve_reports_every_stage_in_metrics_and_the_log $L::test_auto_layer_partition_serves_stocks_tokens[pp3]"
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks metrics-cost shared-layouts

# 2. One H200, after the metrics test's fix (its model now has a tokenizer): the
#    metrics test alone, both stages on the GPU through the shim.
export KIT_LAYOUT_STREAM_1="tests/e2e/test_metrics_serve.py::test_serve_reports_every_stage_in_metrics_and_the_log"
export KIT_LAYOUT_STREAM_2="" KIT_LAYOUT_STREAM_3="" KIT_LAYOUT_STREAM_4=""
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks shared-layouts

# 3. One H200, after bench read the ranks' plan records: the shared-batch step.
bash benchmarks/gpu_kit/run_checks.sh /tmp/checks shared-batch
