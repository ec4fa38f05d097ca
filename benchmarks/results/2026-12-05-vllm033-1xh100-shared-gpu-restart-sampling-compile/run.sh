#!/usr/bin/env bash
# One H100, vLLM 0.33.0 from kit k33 (benchmarks/gpu_kit/README.md), at b57035b, every rank
# on the one GPU (benchmarks/gpu_kit/shared_gpu/): start-up times compare runners started one
# at a time on the same machine; nothing here is a serving speed. From the repository root:
R=benchmarks/gpu_kit/run_checks.sh
# restart-plugin-first/: python -m benchmarks.tools.restart_check --order plugin,stock
bash $R /tmp/go/restart shared-restart
# restart-stock-first/: python -m benchmarks.tools.restart_check --order stock,plugin
bash $R /tmp/go/rev shared-restart-reversed
