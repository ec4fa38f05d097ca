#!/usr/bin/env bash
# GPU runs on one host with two or four GPUs: the GPU tests, and the runs behind the
# README's results. Each job runs on one GPU pair (PP=2), its engines one at a time.
#
#   bash benchmarks/gpu_matrix.sh start JOB_A JOB_B  # JOB_A on GPUs 0,1, JOB_B on 2,3, detached
#   bash benchmarks/gpu_matrix.sh start JOB          # one job on every GPU of the host
#   bash benchmarks/gpu_matrix.sh start JOB+JOB2     # jobs one after the other
#   bash benchmarks/gpu_matrix.sh wait SECONDS       # wait, print progress, pack results into $OUT
#
# Jobs:
#   tests          the GPU tests (pytest -m gpu): tokens against stock per graph mode,
#                  structured outputs, a stage fault, a short soak, start-up refusals
#   engine-0.6b    requests arriving while the engine steps (--workload engine): V1, stock,
#                  the plugin, the plugin filling only idle steps (plugin-fill), profiled
#   batch-0.6b     the batch cell, random weights: speed, and tokens against stock
#   moe            Qwen3-30B-A3B (dummy weights): tokens against stock (batch), then engine
#   serve-0.6b     vllm serve + vllm bench serve, concurrency 200: stock, plugin, V1
#   soak           (all GPUs) the full serving soak: every graph mode, preemption, vLLM's
#                  batch-invariant mode, Ray (if installed), the start-up refusals;
#                  several servers share each GPU pair, each with a fixed KV cache
#   soak-sampling  the serving soak with the sampling mix and the token check
#   soak-32b       the sampling-mix soak with a quarter structured outputs, under preemption,
#                  Qwen3-32B dense shape (dummy weights)
#   soak-30b-a3b   the same, Qwen3-30B-A3B (MoE, dummy weights)
#   moe-modes      Qwen3-30B-A3B: tokens against stock in PIECEWISE, FULL_DECODE_ONLY, breakable
#   structured-big structured outputs on the 32B dense and the 30B-A3B shapes (byte vocabulary)
#   faults         a stage fault, first and last stage, under the mp and (if installed) Ray executors
#   soak-lora      the soak with 3 LoRA adapters served beside the base model, at
#                  gpu_memory_utilization 0.95, each server's graph-memory estimate recorded
#   examples       the examples/ scripts as written, on a local model directory
#
# Jobs behind older results were removed once the GPU tests covered them or newer
# runs replaced them; each result's README names the commit its command ran at, and
# the script at that commit holds the job.
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
# From the repository root: the tests and benchmarks.tools are imported from there.
cd "$(dirname "$self")/.."
RES=${RES:-/tmp/res}
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
BENCH="python3 -m vllm_pp_cudagraph.commands.bench"
SOAK="python3 -m benchmarks.tools.soak --kv-cache-gib 6"
FAP=full_and_piecewise

job_tests() {
  python3 -m pytest -m gpu -v -rs -p no:cacheprovider tests --junitxml "$RES/gpu-tests.xml"
}

# Requests arriving while the engine steps (--workload engine), PP=2, FULL_AND_PIECEWISE:
# V1, stock and the plugin (its default at PP=2 merges decode groups) twice each, the
# plugin filling only idle steps (the old default) once, interleaved, each profiled.
job_engine-0.6b() {
  $BENCH --workload engine --weights dummy --repeat 3 --profile --timeout 300 --deadline 600 \
    --out "$RES/engine-0.6b" \
    --modes v1:$FAP,stock:$FAP,plugin:$FAP,plugin-fill:$FAP,plugin:$FAP,v1:$FAP,stock:$FAP
}

# The batch cell at PP=2 with random weights: speed and the plugin's tokens against stock's.
job_batch-0.6b() {
  $BENCH --workload batch --repeat 3 --timeout 240 --deadline 300 --out "$RES/batch-0.6b" \
    --modes stock:$FAP,plugin:$FAP,v1:$FAP
}

# The MoE model (dummy weights): the plugin's tokens against stock's under batch
# queueing, then requests arriving while the engine steps. The token check runs the
# plugin on vLLM's cadence (plugin-cadence): the default cadence groups decodes by
# measured time, and MoE kernels round differently for other groups, so only vLLM's
# cadence forms stock's batches on this model.
job_moe() {
  $BENCH --model qwen3-30b-a3b --weights dummy --workload batch --repeat 1 --timeout 400 \
    --deadline 500 --out "$RES/batch-30b-a3b" --modes stock:$FAP,plugin-cadence:$FAP
  $BENCH --model qwen3-30b-a3b --weights dummy --workload engine --repeat 3 --profile \
    --timeout 300 --deadline 450 --out "$RES/engine-30b-a3b" --modes stock:$FAP,plugin:$FAP,v1:$FAP
}

# vllm serve driven by vllm bench serve: random dataset, 64 in / 256 out, 1,000 prompts.
job_serve-0.6b() {
  $BENCH --workload serve --weights dummy --concurrency 200 --num-requests 1000 --input-len 64 \
    --output-len 256 --repeat 2 --timeout 240 --deadline 420 --out "$RES/serve-0.6b" \
    --modes stock:$FAP,plugin:$FAP,v1:$FAP
}

# One soak in the background, its console in $RES/NAME.txt; the next starts 5 s later.
soak_bg() {
  local name=$1; shift
  $SOAK --out "$RES/$name" "$@" >"$RES/$name.txt" 2>&1 &
  sleep 5
}

# The soak's two GPU pairs; on a two-GPU host both are the one pair.
gpu_pairs() {
  A=0,1 B=2,3
  [ "$(nvidia-smi -L | wc -l)" -ge 4 ] || B=0,1
}

job_soak() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-compiled --modes piecewise,full_and_piecewise,full_decode_only --refusals \
    --gpus $A $B --servers-per-gpus 3 --port 8000
  soak_bg soak-eager --modes eager,breakable --gpus $B $A --port 8100
  soak_bg soak-preemption --modes piecewise --preemption --gpus $A $B $A --port 8200
  soak_bg soak-invariant --modes full_and_piecewise --batch-invariant --gpus $B $A $B \
    --port 8300
  if python3 -c "import ray" 2>/dev/null; then
    soak_bg soak-ray --modes full_and_piecewise --ray --gpus $A --port 8400
  fi
  wait
}

# The serving soak with the sampling mix (seeded sampling, penalties, n=2, logprobs,
# stop strings) and the token check, on this job's GPU pair.
job_soak-sampling() {
  local gpus=$CUDA_VISIBLE_DEVICES
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-sampling --sampling-mix --token-check --modes full_and_piecewise \
    --gpus $gpus $gpus $gpus --port 9500
  wait
  export CUDA_VISIBLE_DEVICES=$gpus
}

# The sampling-mix soak (2,000 requests, a tenth cancelled, half streamed) under
# preemption with the token check, on a model that needs both GPUs. vLLM's dummy weights:
# outputs barely depend on the layers, so the token check is weaker than on 0.6B.
big_soak() {
  local name=$1 shape=$2 gpus=$CUDA_VISIBLE_DEVICES
  unset CUDA_VISIBLE_DEVICES
  soak_bg "$name" --shape "$shape" --modes full_and_piecewise --sampling-mix --structured \
    --preemption --token-check --gpus $gpus --port 9600
  wait
  export CUDA_VISIBLE_DEVICES=$gpus
}
job_soak-32b() { big_soak soak-32b qwen3-32b; }
job_soak-30b-a3b() { big_soak soak-30b-a3b qwen3-30b-a3b; }

# No fixed KV cache here: the point is vLLM's own sizing at a high memory share, with
# the graphs LoRA adds (the plugin's estimate and what capture took, per server, in soak.json).
job_soak-lora() {
  python3 -m benchmarks.tools.soak --out "$RES/soak-lora" --lora 3 --gpu-memory-utilization 0.95 \
    --modes full_and_piecewise --sampling-mix --token-check --port 9700 >"$RES/soak-lora.txt" 2>&1
}

job_structured-big() {
  for shape in qwen3-32b qwen3-30b-a3b; do
    python3 -m benchmarks.tools.serve_checks structured --out "$RES/structured-big" \
      --shape $shape --gpu-memory-utilization 0.9 --port 8800 >>"$RES/structured-big.txt" 2>&1
  done
}

# The plugin on vLLM's cadence, as in job_moe; breakable against eager (its family).
job_moe-modes() {
  $BENCH --model qwen3-30b-a3b --weights dummy --workload batch --repeat 0 --timeout 400 \
    --out "$RES/moe-modes" --modes stock:piecewise,plugin-cadence:piecewise,\
stock:full_decode_only,plugin-cadence:full_decode_only,stock:eager,plugin-cadence:breakable
}

job_faults() {
  local executors=mp stage executor
  python3 -c "import ray" 2>/dev/null && executors="mp ray"
  for executor in $executors; do
    for stage in first last; do
      python3 -m benchmarks.tools.serve_checks fault --out "$RES/faults" --stage $stage \
        $([ $executor = ray ] && echo --ray) --port 8700 >>"$RES/faults.txt" 2>&1
    done
  done
}

job_examples() {
  local model=/tmp/example-model
  python3 -c "from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir as w; \
w('$model', 'qwen3-0.6b-bytes', tokenizer=True)"
  python3 examples/offline_pp2.py $model --load-format dummy >"$RES/example-offline.txt" 2>&1
  echo "exit $?" >>"$RES/example-offline.txt"
  VLLM="python3 -m vllm.entrypoints.cli.main" PORT=8500 bash examples/serve_pp2.sh $model \
    --load-format dummy >"$RES/example-serve.txt" 2>&1
  echo "exit $?" >>"$RES/example-serve.txt"
  python3 examples/direct_runner.py $model --load-format dummy >"$RES/example-direct.txt" 2>&1
  echo "exit $?" >>"$RES/example-direct.txt"
}

case "$1" in
  start)
    mkdir -p "$RES"
    if [ $# -eq 2 ]; then
      all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)
      setsid bash "$self" run "$2" "$all" >"$RES/$2.out" 2>&1 </dev/null &
    else
      setsid bash "$self" run "$2" 0,1 >"$RES/$2.out" 2>&1 </dev/null &
      setsid bash "$self" run "$3" 2,3 >"$RES/$3.out" 2>&1 </dev/null &
    fi
    sleep 2; echo started ;;
  run)
    export CUDA_VISIBLE_DEVICES=$3 VLLM_CACHE_ROOT=/tmp/vcache-$2
    rc=0
    for job in ${2//+/ }; do "job_$job" || rc=$?; done
    echo "JOB DONE rc=$rc" ;;
  wait)
    end=$((SECONDS + $2))
    while [ $SECONDS -lt $end ]; do
      [ "$(grep -L 'JOB DONE' "$RES"/*.out 2>/dev/null | wc -l)" -eq 0 ] && break
      sleep 10
    done
    for f in "$RES"/*.out "$RES"/*.txt; do
      [ -f "$f" ] && { echo "== $f"; grep -E '^\[|^\{|JOB DONE|agree|Error|servers in|PASSED|FAILED|SKIPPED|passed|failed' "$f" | cut -c1-400 | tail -25; }
    done
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    # traces stay behind (large); their per-step summaries are in the JSON
    tar -C "$RES" --exclude=traces --exclude=model -czf "$OUT/res.tgz" . && ls -la "$OUT" ;;
esac
