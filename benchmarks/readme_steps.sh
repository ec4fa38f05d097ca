#!/usr/bin/env bash
# After fresh_clone.sh, in the clone's environment: the checks a new user meets past
# the install, as the README names them (bad settings under `check`
# and `vllm serve`, `check --model`, `plan`, bad arguments). Each command's output goes
# to OUT/NAME.out; one line per command says its exit status and seconds.
#   usage: benchmarks/readme_steps.sh CLONE OUT   (CLONE: fresh_clone.sh's DIR)
set -u
clone=${1:?usage: benchmarks/readme_steps.sh CLONE OUT}
T=$(mkdir -p "${2:?usage: benchmarks/readme_steps.sh CLONE OUT}" && cd "$2" && pwd)
. "$clone/.venv/bin/activate"
cd "$clone" || exit 1
step() { local name=$1; shift; local s=$(date +%s.%N); "$@" > "$T/$name.out" 2>&1; local rc=$?; local e=$(date +%s.%N); printf '%s rc=%s %.1fs\n' "$name" "$rc" "$(echo "$e - $s" | bc)"; }
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
step check-model-memory vllm-pp-cudagraph check --model qwen3-32b --pp 2 --gpu-memory-gib 141
step check-bad-arg vllm-pp-cudagraph check --pp
step plan-readme vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --prompts 256 --max-num-seqs 256 --gpu h200
step plan-serve vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --concurrency 1024 --max-num-seqs 1024 --gpu h200
step plan-70b-24g vllm-pp-cudagraph plan --model llama-3.1-70b --gpus 2 --gpu-memory-gib 24
step plan-bad-gpu vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --gpu h300
step plan-bad-memory vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --gpu-memory-gib -5
step check-model-bad-memory vllm-pp-cudagraph check --model qwen3-32b --pp 2 --gpu-memory-gib 0
