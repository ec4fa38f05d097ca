#!/usr/bin/env bash
# A new user's first contact on a CPU machine, in an environment where the package
# is installed (after `pip install ".[test]"`): `check` in the cases the README
# states exit codes for, and `bench` with no GPU. Prints each command, its output
# and its exit status.
#   usage: benchmarks/first_contact_cpu.sh
set -u
run() {
  echo "\$ $*"
  local start=$SECONDS
  env "$@" 2>&1 | grep -v "^W[0-9]\{4\} \|Failed to import from vllm._C"
  local rc=${PIPESTATUS[0]}
  echo "[exit $rc, $((SECONDS - start)) s]"
  echo
}
run vllm-pp-cudagraph check
run VLLM_PLUGINS=pp_cudagraph vllm-pp-cudagraph check
run VLLM_PLUGINS=pp-cudagraph vllm-pp-cudagraph check
run VLLM_PLUGINS=pp_cudagraph VLLM_USE_V2_MODEL_RUNNER=0 vllm-pp-cudagraph check
run VLLM_PP_CUDAGRAPH_DECODE_CADENCE=maybe vllm-pp-cudagraph check
run VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 vllm-pp-cudagraph check
run vllm-pp-cudagraph bench --pp 2 --out /tmp/first-contact-bench
ls -d /tmp/first-contact-bench 2>/dev/null || echo "(nothing written: /tmp/first-contact-bench does not exist)"
