#!/usr/bin/env bash
# The GPU tests on one host with 2 GPUs, as benchmarks/README.md ("GPU tests")
# documents them: vLLM 0.26.0 and this package installed from wheels into the
# directory SITE_DIR names ("Offline hosts"), plus the test-only vLLM plugins.
#   SITE_DIR=DIR bash run.sh OUT
# OUT gets pytest's console output (pytest.txt), its JUnit report (gpu-tests.xml)
# and the tests' temporary folders (engine and server logs, reports).
set -uo pipefail
out=${1:?usage: run.sh OUT}
mkdir -p "$out"
export PYTHONPATH=${SITE_DIR:?set SITE_DIR} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$SITE_DIR" \
  tests/e2e/soak_plugins
python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$out/tmp" \
  --junitxml "$out/gpu-tests.xml" tests 2>&1 | tee "$out/pytest.txt"
