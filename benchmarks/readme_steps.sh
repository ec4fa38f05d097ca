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
# A bad value of each setting, and a misspelt name, under `check` and `vllm serve`.
for bad in BREAKABLE=maybe DECODE_CADENCE=bogus DIRECT_HANDOFF=2 KV_UPDATE_IN_GRAPHS=x \
    LAYER_PARTITION=3,3 METRICS=perhaps METRICS_DIR=/etc/passwd METRICS_DIR=/proc/none/x \
    STALL_LIMIT_S=-1 ALLOW_UNPROVEN=x ALLOW_UNSUPPORTED_VLLM=x DECODE_CADNCE=merge; do
  name=$(echo "${bad%%=*}-${bad#*=}" | tr 'A-Z/,' 'a-z__')
  (export VLLM_PLUGINS=pp_cudagraph "VLLM_PP_CUDAGRAPH_$bad"
   step "check-$name" vllm-pp-cudagraph check
   step "serve-$name" vllm serve Qwen/Qwen3-0.6B -pp 2)
done
step check-model vllm-pp-cudagraph check --model qwen3-32b --pp 2
step check-model-memory vllm-pp-cudagraph check --model qwen3-32b --pp 2 --gpu-memory-gib 141
step check-bad-arg vllm-pp-cudagraph check --pp
step plan-readme vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --prompts 256 --max-num-seqs 256 --gpu h200
step plan-serve vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --concurrency 1024 --max-num-seqs 1024 --gpu h200
step plan-70b-24g vllm-pp-cudagraph plan --model llama-3.1-70b --gpus 2 --gpu-memory-gib 24
step plan-bad-gpu vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --gpu h300
step plan-bad-memory vllm-pp-cudagraph plan --model qwen3-32b --gpus 2 --gpu-memory-gib -5
step check-model-bad-memory vllm-pp-cudagraph check --model qwen3-32b --pp 2 --gpu-memory-gib 0
