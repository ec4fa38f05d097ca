#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from the kit (benchmarks/gpu_kit/README.md: prepare.sh 0.33.0, each
# part's install.sh), the project at df5dcea (a `git archive` of it), every rank on the one
# GPU (benchmarks/gpu_kit/shared_gpu/): tokens and behaviour only; nothing here is a speed.
# Two pytest streams side by side on the GPU.
T=tests/e2e/test_layouts.py
export KIT_SHARED_GPU_KV_GIB=1 KIT_LAYOUT_STREAM_3=
export KIT_LAYOUT_STREAM_1="$T::test_auto_layer_partition_serves_stocks_tokens[pp3]"
export KIT_LAYOUT_STREAM_2="tests/e2e/test_pp_engine.py::test_speculative_decoding_serves_with_the_tokens_of_a_stock_engine[eagle3]"
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks shared-layouts
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 400
# process-lines.txt: from each plugin engine's log,
#   grep -h "vllm-pp-cudagraph active\|Using custom scheduler class" plugin-*.log
