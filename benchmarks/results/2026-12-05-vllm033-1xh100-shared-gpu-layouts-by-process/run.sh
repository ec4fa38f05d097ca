#!/usr/bin/env bash
# One H100, vLLM 0.33.0 from the kit (benchmarks/gpu_kit/README.md: prepare.sh 0.33.0, each
# part's install.sh), the project at 2b55303, every rank on the one GPU
# (benchmarks/gpu_kit/shared_gpu/): tokens and behaviour only; nothing here is a speed.
# Three pytest streams side by side on the GPU, each one layout in FULL_AND_PIECEWISE
# (stock, the plugin with its defaults, stock again as the control).
T=tests/e2e/test_layouts.py::test_layout_serves_stocks_tokens_in_every_graph_mode
export KIT_SHARED_GPU_KV_GIB=1
export KIT_LAYOUT_STREAM_1="--graph-modes=full_and_piecewise $T[pp2]"
export KIT_LAYOUT_STREAM_2="--graph-modes=full_and_piecewise $T[tp2xpp2]"
export KIT_LAYOUT_STREAM_3="--graph-modes=full_and_piecewise $T[pp4]"
bash benchmarks/gpu_kit/run_checks.sh start /tmp/checks shared-layouts
bash benchmarks/gpu_kit/run_checks.sh wait /tmp/checks 540
# process-lines.txt: from each plugin engine's log,
#   grep -h "vllm-pp-cudagraph active\|Using custom scheduler class" plugin-full_and_piecewise.log
