#!/usr/bin/env bash
# 4x H200 host, vLLM 0.33.0 from kit k33c, Ray 2.60.0 (benchmarks/gpu_kit/README.md,
# benchmarks/install_ray.sh), one after another under setsid:
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0
R=benchmarks/gpu_kit/run_checks.sh
# at a9d1f81: faults-run1/ (the plugin on GPUs 0,1 beside stock on 2,3)
KIT_FAULT_CASES="mp:last:raise ray:last:raise" bash $R /tmp/f faults
# at a9d1f81: layouts/ (a GPU per rank)
L=tests/e2e/test_layouts.py E=tests/e2e/test_pp_engine.py
KIT_TESTS="--graph-modes=full_and_piecewise \
  $L::test_layout_serves_stocks_tokens_in_every_graph_mode[tp2xpp2] \
  $L::test_auto_layer_partition_serves_stocks_tokens[pp3] \
  $E::test_speculative_decoding_serves_with_the_tokens_of_a_stock_engine[eagle3]" \
  bash $R /tmp/g gpu-tests
# (the soak-32b step that followed was stopped at once, and
#  the orphans of faults-run1 were killed by hand two minutes into the layout tests)
# with the parent watch of 1bb90f7: faults-run2/, then faults-run3/
KIT_FAULT_CASES="mp:last:raise" bash $R /tmp/f2 faults
KIT_FAULT_CASES="mp:last:raise mp:last:raise" bash $R /tmp/f3 faults
