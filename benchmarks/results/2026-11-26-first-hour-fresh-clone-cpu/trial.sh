#!/usr/bin/env bash
# The README's first hour from a fresh clone, each step timed: install, check, bad
# settings under check and under vllm serve, the CLI's refusals, the test command.
# usage: trial.sh REPO WORKDIR   (REPO: a clone URL or path; WORKDIR: emptied first)
set -u
repo=${1:?usage: trial.sh REPO WORKDIR} T=${2:?usage: trial.sh REPO WORKDIR}
rm -rf "$T" && mkdir -p "$T"; log=$T/trial.log
step() { local name=$1; shift; local s=$(date +%s.%N); "$@" > "$T/$name.out" 2>&1; local rc=$?; local e=$(date +%s.%N); printf '%s rc=%s %.1fs\n' "$name" "$rc" "$(echo "$e - $s" | bc)" | tee -a "$log"; }
git clone -q "$repo" "$T/clone" && cd "$T/clone" && git log --format=%h -1 >> "$log"
step venv python3 -m venv "$T/venv"
. "$T/venv/bin/activate"
step install pip install . "vllm==0.26.0"
du -sh "$T/venv" >> "$log"
step check-unset vllm-pp-cudagraph check
VLLM_PLUGINS=pp_cudagraph step check-enabled vllm-pp-cudagraph check
VLLM_PLUGINS=pp_cudagraph step check-full vllm-pp-cudagraph check --full
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_DECODE_CADENCE=bogus step check-bad-cadence vllm-pp-cudagraph check
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_LAYER_PARTITION=3,3 step check-bad-partition vllm-pp-cudagraph check
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_DECODE_CADNCE=merge step check-unknown vllm-pp-cudagraph check
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_DECODE_CADENCE=bogus step serve-bad-cadence vllm serve Qwen/Qwen3-0.6B -pp 2
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_LAYER_PARTITION=3,3 step serve-bad-partition vllm serve Qwen/Qwen3-0.6B -pp 2
VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_DECODE_CADNCE=merge step serve-unknown vllm serve Qwen/Qwen3-0.6B -pp 2
step check-model vllm-pp-cudagraph check --model qwen3-32b --pp 2
step check-bad-arg vllm-pp-cudagraph check --pp
step bench-no-gpu vllm-pp-cudagraph bench --pp 2 --out "$T/bench-out"
step install-test pip install -e ".[test]"
step pytest python -m pytest -q tests
tail -3 "$T/pytest.out" >> "$log"
