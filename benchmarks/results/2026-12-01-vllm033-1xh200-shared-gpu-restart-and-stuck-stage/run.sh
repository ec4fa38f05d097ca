#!/usr/bin/env bash
# One H200, vLLM 0.33.0 from kit k33c (benchmarks/gpu_kit/README.md), at df69601, every rank
# on the one GPU (benchmarks/gpu_kit/shared_gpu/): start-up times are comparable with each
# other (one server at a time, the same machine); nothing here is a serving speed.
# Detached under setsid, then waited for (run_checks.sh start / wait).
R=benchmarks/gpu_kit/run_checks.sh
# restart-plugin-first/, then stuck-stage/, then restart-stock-first/:
#   shared-restart           python -m benchmarks.tools.restart_check --order plugin,stock
#   shared-stuck-stage       python -m benchmarks.tools.serve_checks fault --how stop ...
#                            (stock PP=2 beside the plugin at PP=2, then the plugin at
#                            TP=2 x PP=2; stall limit 20 s)
#   shared-restart-reversed  python -m benchmarks.tools.restart_check --order stock,plugin
bash $R start /tmp/checks shared-restart shared-stuck-stage shared-restart-reversed
bash $R wait /tmp/checks 540
