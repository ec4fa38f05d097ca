#!/usr/bin/env bash
# The GPU runs behind benchmarks/results/, on one host with two or four GPUs: two
# PP=2 engines side by side, each on its own pair of GPUs, each job running its
# engines one at a time.
#
#   bash benchmarks/gpu_matrix.sh start JOB_A JOB_B  # JOB_A on GPUs 0,1, JOB_B on 2,3, detached
#   bash benchmarks/gpu_matrix.sh start JOB          # one job on every GPU of the host
#   bash benchmarks/gpu_matrix.sh start JOB+JOB2     # jobs one after the other
#   bash benchmarks/gpu_matrix.sh wait SECONDS       # wait, print progress, pack results into $OUT
#
# Jobs:
#   table          the bench table, every mode, warm-up + median of 3
#   extras         27-layer model (uneven split) incl. gpu_memory_utilization=0.92,
#                  decode-step profiles, vLLM's default attention backend
#   tokens-graphs  plugin vs stock token equality, compiled modes, random weights
#   tokens-eager   the same for eager and breakable, and on the 27-layer model
#   main           the table with today's defaults (random weights, requests queued as
#                  one batch), stock eager and piecewise run twice (stock's own noise),
#                  then token equality on the 27-layer model incl. 0.92
#   perf-128       V1 / stock / plugin FULL_AND_PIECEWISE, three engines each, interleaved
#   perf-512       the same at 512 prompts, then profile-512
#   profile-512    one profiled engine each of V1, stock and the plugin at 512 prompts
#   fill-128       FULL_AND_PIECEWISE: the plugin, the plugin keeping vLLM's PP decode cadence
#                  (plugin-cadence), V1, twice each interleaved, and stock once (tokens)
#   fill-512       the plugin, V1 and plugin-cadence at 512 prompts, then one profiled
#                  plugin engine (are the empty steps gone?)
#   fill-modes     eager, PIECEWISE and breakable, the plugin against stock, 128 prompts
#   recheck        FULL_AND_PIECEWISE at 128 prompts: the plugin, stock, plugin-cadence and V1
#                  once each (tokens and speed after a runner change), the serving soak with
#                  idle steps filled (FULL_AND_PIECEWISE, and with preemption, each with the
#                  token check), then FULL_DECODE_ONLY against stock
#   kv             PIECEWISE: the plugin, the plugin with vLLM's split at the KV-cache write
#                  (plugin-kvsplit), twice each, stock and plugin eager once, interleaved;
#                  then one profiled plugin PIECEWISE engine (where a decode step's host
#                  time goes)
#   final          every goal of the performance issue at one commit: FULL_AND_PIECEWISE
#                  against V1 at 128 and 512 prompts, PIECEWISE, breakable and eager
#                  against each other and against stock
#   fresh-compile  PIECEWISE tokens after fresh compiles: the plugin then plugin-kvsplit in
#                  one cache, then stock and plugin-kvsplit twice each, each with its own cache
#   soak-fill-modes (all GPUs) the serving soak with idle steps filled, PIECEWISE and
#                  breakable, with the token check
#   soak-fill-rest (all GPUs) the other soaks with idle steps filled: eager, FULL_DECODE_ONLY,
#                  preemption (PIECEWISE; eager under batch invariance), batch invariance
#   soak-repeat    (all GPUs) eager and FULL_DECODE_ONLY once more, and preemption with stock
#                  preempted too (PIECEWISE; eager under batch invariance), each with the
#                  token check
#   soak-fdo-cadence (all GPUs) FULL_DECODE_ONLY soaks side by side: the plugin with idle
#                  steps filled, and keeping vLLM's decode cadence (plugin-cadence)
#   tokens-mixed   token equality when prefills share batches with decodes (staggered
#                  output lengths, more prompts than --max-num-seqs): FULL_DECODE_ONLY (stock
#                  twice, plugin-cadence, plugin-cadence-kvsplit, plugin), then PIECEWISE,
#                  FULL_AND_PIECEWISE and eager (stock, plugin-cadence)
#   mixed-eager    (one GPU pair) the eager pair tokens-mixed ran out of time for: stock,
#                  plugin-cadence and the plugin, eager, prefills joining decodes
#   mixed-fdo-speed (one GPU pair) FULL_DECODE_ONLY with prefills joining decodes: stock,
#                  plugin-cadence-kvsplit and plugin-cadence, speed and tokens once more
#   soak-close     (all GPUs) two plugin and three stock runs per soak, with the token
#                  check, where one soak could not resolve the margin: PIECEWISE under
#                  preemption and eager; FULL_AND_PIECEWISE on Ray (if installed); FULL
#                  (soak, FULL lowered with FlashInfer, bench tokens against stock)
#   soak-bi        (all GPUs) breakable against stock breakable under vLLM's batch-invariant
#                  mode, with the token check, one soak per GPU pair, to be pooled
#   fdo-recheck    (one GPU pair; pairs with tokens-mixed) FULL_DECODE_ONLY soaks with the
#                  token check, keeping vLLM's cadence and with the fill, side by side
#   soak           (all four GPUs) the serving soak: every graph mode, preemption, vLLM's
#                  batch-invariant mode, Ray (if installed), the start-up refusals;
#                  several servers share each GPU pair, each with a fixed KV cache
#   soak-followup  (all GPUs) preemption with the scheduler fix, breakable against
#                  stock breakable, each also under batch invariance
#   soak-tokens    (all GPUs) the runs soak-followup failed, with the token check:
#                  preemption (eager under batch invariance, piecewise) and breakable
#                  against stock breakable under batch invariance
#   fault          a first-stage fault injected mid-serving (serve_checks fault): the plugin
#                  must stop the server within 30 s; stock under the same fault beside it
#   structured     structured outputs with the plugin's defaults (serve_checks structured):
#                  half JSON-schema requests arriving over time, PP=2 (PP=4 with 4 GPUs)
#   examples       the examples/ scripts as written, on a local model directory
#   engine-0.6b    requests arriving while the engine steps (--workload engine): V1, stock,
#                  the plugin, the plugin filling only idle steps (plugin-fill), profiled
#   batch-0.6b     the batch cell, random weights: speed, and tokens against stock
#   moe            Qwen3-30B-A3B (dummy weights): tokens against stock (batch), then engine
#   serve-0.6b     vllm serve + vllm bench serve, concurrency 200: stock, plugin, V1
#   soak-sampling  the serving soak with the sampling mix and the token check
set -u
RES=${RES:-/tmp/res}
export PYTHONPATH=/tmp/site NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
BENCH="python3 -m vllm_pp_cudagraph.bench"

job_table() {
  $BENCH --weights dummy --repeat 3 --timeout 240 --deadline 1000 --out "$RES/table"
}

job_extras() {
  $BENCH --weights dummy --model qwen3-0.6b-27l --repeat 0 --timeout 220 --deadline 520 --out "$RES/uneven" \
    --modes stock:piecewise,plugin:full_and_piecewise@0.92,plugin:piecewise,plugin:full_decode_only,stock:eager,plugin:breakable,plugin:eager
  $BENCH --weights dummy --repeat 1 --profile --timeout 240 --deadline 330 --out "$RES/profile" \
    --modes v1:full_and_piecewise,stock:full_and_piecewise,plugin:full_and_piecewise,plugin:eager
  $BENCH --weights dummy --repeat 0 --attention-backend "" --timeout 200 --deadline 240 --out "$RES/default-backend" \
    --modes stock:piecewise,plugin:full_and_piecewise,stock:eager,plugin:breakable
}

job_tokens-graphs() {
  $BENCH --repeat 0 --timeout 200 --deadline 330 --out "$RES/tokens-graphs" \
    --modes stock:piecewise,plugin:piecewise,plugin:full_and_piecewise,stock:full_and_piecewise,plugin:full_decode_only,stock:full_decode_only
}

job_tokens-eager() {
  $BENCH --repeat 0 --timeout 150 --deadline 220 --out "$RES/tokens-eager" \
    --modes stock:eager,plugin:eager,plugin:breakable,stock:breakable
  $BENCH --model qwen3-0.6b-27l --repeat 0 --timeout 100 --deadline 110 --out "$RES/tokens-uneven" \
    --modes stock:eager,plugin:breakable,plugin:eager
}

job_main() {
  $BENCH --repeat 3 --timeout 240 --deadline 1100 --out "$RES/table-v2" \
    --modes "$(python3 -c 'from vllm_pp_cudagraph.bench.cli import DEFAULT_MODES; print(",".join(DEFAULT_MODES))'),stock:eager,stock:piecewise"
  $BENCH --model qwen3-0.6b-27l --repeat 0 --timeout 200 --deadline 300 --out "$RES/tokens-v2-uneven" \
    --modes stock:full_and_piecewise,plugin:full_and_piecewise@0.92,stock:eager,plugin:breakable,plugin:eager
}

# V1, stock and the plugin (FULL_AND_PIECEWISE), three engines each, interleaved: engines
# of one run differed by up to 20%, so the comparison is between medians across engines.
PERF_MODES=$(printf 'v1:full_and_piecewise,stock:full_and_piecewise,plugin:full_and_piecewise,%.0s' 1 2 3)

job_perf-128() {
  $BENCH --repeat 3 --timeout 240 --deadline 1100 --out "$RES/perf-128" --modes "${PERF_MODES%,}"
}

job_perf-512() {
  $BENCH --prompts 512 --repeat 3 --timeout 240 --deadline 1100 --out "$RES/perf-512" --modes "${PERF_MODES%,}"
  job_profile-512
}

job_profile-512() {
  $BENCH --prompts 512 --repeat 1 --profile --timeout 240 --deadline 400 --out "$RES/profile-512" \
    --modes v1:full_and_piecewise,stock:full_and_piecewise,plugin:full_and_piecewise
}

job_fill-128() {
  $BENCH --repeat 3 --timeout 240 --deadline 900 --out "$RES/fill-128" \
    --modes plugin:full_and_piecewise,plugin-cadence:full_and_piecewise,v1:full_and_piecewise,stock:full_and_piecewise,plugin:full_and_piecewise,plugin-cadence:full_and_piecewise,v1:full_and_piecewise
}

job_fill-512() {
  $BENCH --prompts 512 --repeat 3 --timeout 240 --deadline 500 --out "$RES/fill-512" \
    --modes plugin:full_and_piecewise,v1:full_and_piecewise,plugin-cadence:full_and_piecewise
  $BENCH --prompts 512 --repeat 1 --profile --timeout 240 --deadline 240 --out "$RES/fill-profile-512" \
    --modes plugin:full_and_piecewise
}

job_fill-modes() {
  $BENCH --repeat 3 --timeout 240 --deadline 700 --out "$RES/fill-modes" \
    --modes plugin:eager,plugin:piecewise,plugin:breakable,stock:eager,stock:piecewise,stock:breakable
}

# Every goal of the performance issue on one commit, in one run per prompt count.
job_final() {
  $BENCH --repeat 3 --timeout 240 --deadline 1200 --out "$RES/final-128" \
    --modes plugin:full_and_piecewise,v1:full_and_piecewise,plugin:piecewise,plugin:breakable,plugin:eager,stock:eager,stock:breakable,stock:piecewise
  $BENCH --prompts 512 --repeat 3 --timeout 240 --deadline 480 --out "$RES/final-512" \
    --modes plugin:full_and_piecewise,v1:full_and_piecewise
}

# Tokens after a fresh compile of vLLM's split. One plugin-kvsplit engine once gave other
# tokens than the same configuration loaded from its cache; it had compiled right after a
# plugin engine, in the same cache. That order first, then stock and plugin-kvsplit twice
# each, every engine with a cache of its own.
job_fresh-compile() {
  local i r
  VLLM_CACHE_ROOT=/tmp/vcache-fresh-seq $BENCH --repeat 1 --timeout 240 --deadline 480 \
    --out "$RES/fresh-seq" --modes plugin:piecewise,plugin-kvsplit:piecewise
  for i in 1 2; do
    for r in plugin-kvsplit stock; do
      VLLM_CACHE_ROOT=/tmp/vcache-fresh-$r-$i $BENCH --repeat 1 --timeout 240 \
        --out "$RES/fresh-$r-$i" --modes $r:piecewise
    done
  done
}

SOAK="python3 -m vllm_pp_cudagraph.bench.soak --kv-cache-gib 6"

# One soak in the background, its console in $RES/NAME.txt; the next starts 5 s later.
soak_bg() {
  local name=$1; shift
  $SOAK --out "$RES/$name" "$@" >"$RES/$name.txt" 2>&1 &
  sleep 5
}

job_recheck() {
  $BENCH --repeat 3 --timeout 240 --deadline 400 --out "$RES/recheck-128" \
    --modes plugin:full_and_piecewise,stock:full_and_piecewise,plugin-cadence:full_and_piecewise,v1:full_and_piecewise
  local gpus=$CUDA_VISIBLE_DEVICES
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-fill --token-check --modes full_and_piecewise --gpus $gpus $gpus $gpus \
    --port 8900
  soak_bg soak-fill-preemption --token-check --modes full_and_piecewise --preemption \
    --gpus $gpus $gpus $gpus --port 9000
  wait
  export CUDA_VISIBLE_DEVICES=$gpus
  $BENCH --repeat 3 --timeout 200 --deadline 200 --out "$RES/full-decode-only" \
    --modes plugin:full_decode_only,stock:full_decode_only
}

job_kv() {
  $BENCH --repeat 3 --timeout 240 --deadline 560 --out "$RES/kv-128" \
    --modes plugin:piecewise,plugin-kvsplit:piecewise,stock:piecewise,plugin:eager,plugin:piecewise,plugin-kvsplit:piecewise
  $BENCH --repeat 1 --profile --timeout 330 --deadline 330 --out "$RES/kv-profile" --modes plugin:piecewise
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

# The soak with idle steps filled (the default since the fifth round) in PIECEWISE and
# breakable, each with the token check; breakable against stock breakable.
job_soak-fill-modes() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-fill-piecewise --token-check --modes piecewise --gpus $A $A $A --port 8900
  soak_bg soak-fill-breakable --token-check --modes breakable --same-stock-mode \
    --gpus $B $B $B --port 9000
  wait
}

# The rest of the soak with idle steps filled, each with the token check: eager and
# FULL_DECODE_ONLY, preemption in PIECEWISE and in eager under batch invariance, and
# FULL_AND_PIECEWISE under batch invariance. Two soaks share each GPU pair.
job_soak-fill-rest() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-fill-eager-fdo --token-check --modes eager,full_decode_only --gpus $A $A $A \
    --port 8900
  soak_bg soak-fill-preemption-piecewise --token-check --modes piecewise --preemption \
    --gpus $A $A $A --port 9000
  soak_bg soak-fill-invariant --token-check --modes full_and_piecewise --batch-invariant \
    --gpus $B $B $B --port 9100
  soak_bg soak-fill-preemption-eager-invariant --token-check --modes eager --preemption \
    --batch-invariant --gpus $B $B $B --port 9200
  wait
}

# A second sample of eager and FULL_DECODE_ONLY with idle steps filled (each missed
# stock's own share by about one point, under one run's sampling noise), and the
# preemption soaks again, now with stock preempted as well: its servers load the
# plugin's scheduler fix alone. Two soaks share each GPU pair.
job_soak-repeat() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-repeat-eager --token-check --modes eager --gpus $A $A $A --port 8900
  soak_bg soak-repeat-fdo --token-check --modes full_decode_only --gpus $A $A $A --port 9000
  soak_bg soak-preemption-both-piecewise --token-check --modes piecewise --preemption \
    --gpus $B $B $B --port 9100
  soak_bg soak-preemption-both-eager-invariant --token-check --modes eager --preemption \
    --batch-invariant --gpus $B $B $B --port 9200
  wait
}

# FULL_DECODE_ONLY differed from stock more often than stock from itself in both soaks
# with idle steps filled: the same soak with the plugin keeping vLLM's decode cadence
# tells whether the fill's different batches account for it.
job_soak-fdo-cadence() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-fdo-fill --modes full_decode_only --gpus $A $A $A --port 8900
  soak_bg soak-fdo-cadence --modes full_decode_only --plugin-runner plugin-cadence \
    --gpus $B $B $B --port 9000
  wait
}

# The FULL_DECODE_ONLY soak keeping vLLM's cadence once more, now with the token check,
# beside the one with the fill; both on this job's GPU pair.
job_fdo-recheck() {
  local gpus=$CUDA_VISIBLE_DEVICES
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-fdo-cadence-tokens --token-check --modes full_decode_only \
    --plugin-runner plugin-cadence --gpus $gpus $gpus $gpus --port 9300
  soak_bg soak-fdo-fill-tokens --token-check --modes full_decode_only \
    --gpus $gpus $gpus $gpus --port 9400
  wait
  export CUDA_VISIBLE_DEVICES=$gpus
}

# The bench's batches are prefill-only then decode-only; under serving, prefills join
# decode batches. Staggered output lengths with more prompts than --max-num-seqs
# admit queued requests one by one, so prefills share batches with decodes on
# every run alike. With vLLM's decode cadence (plugin-cadence) the plugin schedules
# as stock does, so its tokens must equal stock's; plugin-cadence-kvsplit also keeps
# vLLM's piecewise split, which tells a difference of the split from one of the runner.
MIXED="--prompts 256 --max-num-seqs 64 --output-len 256 --output-len-spread 128 --repeat 1"
job_tokens-mixed() {
  $BENCH $MIXED --timeout 200 --deadline 700 --out "$RES/mixed-fdo" \
    --modes stock:full_decode_only,plugin-cadence:full_decode_only,plugin-cadence-kvsplit:full_decode_only,plugin:full_decode_only,stock:full_decode_only
  $BENCH $MIXED --timeout 200 --deadline 480 --out "$RES/mixed-modes" \
    --modes stock:piecewise,plugin-cadence:piecewise,stock:full_and_piecewise,plugin-cadence:full_and_piecewise,stock:eager,plugin-cadence:eager
}

job_mixed-eager() {
  $BENCH $MIXED --timeout 260 --deadline 400 --out "$RES/mixed-eager" \
    --modes stock:eager,plugin-cadence:eager,plugin:eager
}

job_mixed-fdo-speed() {
  $BENCH $MIXED --timeout 260 --deadline 400 --out "$RES/mixed-fdo-speed" \
    --modes stock:full_decode_only,plugin-cadence-kvsplit:full_decode_only,plugin-cadence:full_decode_only
}

# One soak compares one plugin run with two stock runs, and how much a run's batches
# churn moves its shares by several points: one soak cannot resolve a one-point
# margin. Two plugin and three stock runs give six cross pairs and three stock pairs.
job_soak-close() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  local RUNS="--plugin-runs 2 --stock-runs 3 --token-check"
  soak_bg close-preemption-piecewise $RUNS --modes piecewise --preemption \
    --gpus $A $A $A $A $A --port 9500
  soak_bg close-eager $RUNS --modes eager --gpus $B $B $B $B $B --port 9600
  if python3 -c "import ray" 2>/dev/null; then
    soak_bg close-ray --token-check --modes full_and_piecewise --ray --gpus $A --port 9700
  fi
  soak_bg close-full --token-check --modes full --lowered-mode --gpus $B $B $B --port 9800
  wait
  # The bench profiles free memory, so it runs once the soaks' servers are gone.
  CUDA_VISIBLE_DEVICES=$A $BENCH --repeat 1 --timeout 300 --deadline 420 --out "$RES/full-tokens" \
    --modes stock:full,plugin:full,plugin-cadence:full >"$RES/full-tokens.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=$B $BENCH $MIXED --timeout 300 --deadline 420 --out "$RES/full-mixed" \
    --modes stock:full,plugin-cadence:full >"$RES/full-mixed.txt" 2>&1 &
  wait
}

# Breakable against stock breakable under batch invariance, not soaked since idle steps
# are filled by default: one soak per pair with the token check, pooled with
# vllm_pp_cudagraph.bench.soak_pool.
job_soak-bi() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  local CASE="--token-check --modes breakable --same-stock-mode --batch-invariant"
  soak_bg bi-a $CASE --plugin-runs 1 --stock-runs 2 --gpus $A $A $A --port 9500
  soak_bg bi-b $CASE --plugin-runs 1 --stock-runs 2 --gpus $B $B $B --port 9600
  wait
}

# What the first soak round left open: preemption with the plugin's scheduler fix
# (eager under batch invariance, where stock differs from itself in ~5% of requests,
# then piecewise), and breakable against stock's own breakable mode.
job_soak-followup() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg soak-preemption-invariant --modes eager --preemption --batch-invariant \
    --gpus $A $B $A --port 8600
  soak_bg soak-breakable --modes breakable --same-stock-mode --gpus $B $A $B --port 8700
  soak_bg soak-breakable-invariant --modes breakable --same-stock-mode --batch-invariant \
    --gpus $A $B $A --port 8800
  wait
  $SOAK --out "$RES/soak-preemption" --modes piecewise --preemption --gpus $A $B $A $B \
    --servers-per-gpus 1 --port 8200 >"$RES/soak-preemption.txt" 2>&1
}

# The token check scores every output with a further stock server, so it tells a
# mishandled token from rounding where the share of differing requests cannot.
job_soak-tokens() {
  local A B; gpu_pairs
  unset CUDA_VISIBLE_DEVICES
  soak_bg tokens-preemption-invariant --token-check --modes eager --preemption \
    --batch-invariant --gpus $A $B $A --port 8600
  soak_bg tokens-breakable-invariant --token-check --modes breakable --same-stock-mode \
    --batch-invariant --gpus $B $A $B --port 8700
  soak_bg tokens-preemption --token-check --modes piecewise --preemption --gpus $A $B $A \
    --port 8800
  wait
}

job_fault() {
  local CHECKS="python3 -m vllm_pp_cudagraph.bench.serve_checks"
  $CHECKS fault --out "$RES/fault" --runner plugin --port 8100 >"$RES/fault-plugin.txt" 2>&1
  $CHECKS fault --out "$RES/fault" --runner stock --port 8200 --exit-within 60 \
    >"$RES/fault-stock.txt" 2>&1
}

job_structured() {
  local CHECKS="python3 -m vllm_pp_cudagraph.bench.serve_checks" n
  n=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | wc -l)
  $CHECKS structured --out "$RES/structured" --pp 2 --port 8300 >"$RES/structured-pp2.txt" 2>&1
  if [ "$n" -ge 4 ]; then
    $CHECKS structured --out "$RES/structured" --pp 4 --port 8400 >"$RES/structured-pp4.txt" 2>&1
  fi
}

job_examples() {
  local model=/tmp/example-model
  python3 -c "from vllm_pp_cudagraph.bench.dummy_model import write_model_dir as w; \
w('$model', 'qwen3-0.6b-bytes', tokenizer=True)"
  python3 examples/offline_pp2.py $model --load-format dummy >"$RES/example-offline.txt" 2>&1
  echo "exit $?" >>"$RES/example-offline.txt"
  VLLM="python3 -m vllm.entrypoints.cli.main" PORT=8500 bash examples/serve_pp2.sh $model \
    --load-format dummy >"$RES/example-serve.txt" 2>&1
  echo "exit $?" >>"$RES/example-serve.txt"
  python3 examples/direct_runner.py $model --load-format dummy >"$RES/example-direct.txt" 2>&1
  echo "exit $?" >>"$RES/example-direct.txt"
}

# Requests arriving while the engine steps (--workload engine), PP=2, FULL_AND_PIECEWISE:
# V1, stock and the plugin (its default at PP=2 merges decode groups) twice each, the
# plugin filling only idle steps (the old default) once, interleaved, each profiled.
FAP=full_and_piecewise
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

# The seed's MoE model (dummy weights): the plugin's tokens against stock's under batch
# queueing, then requests arriving while the engine steps.
job_moe() {
  $BENCH --model qwen3-30b-a3b --weights dummy --workload batch --repeat 1 --timeout 400 \
    --deadline 500 --out "$RES/batch-30b-a3b" --modes stock:$FAP,plugin:$FAP
  $BENCH --model qwen3-30b-a3b --weights dummy --workload engine --repeat 3 --profile \
    --timeout 300 --deadline 450 --out "$RES/engine-30b-a3b" --modes stock:$FAP,plugin:$FAP,v1:$FAP
}

# vllm serve driven by vllm bench serve: random dataset, 64 in / 256 out, 1,000 prompts.
job_serve-0.6b() {
  $BENCH --workload serve --weights dummy --concurrency 200 --num-requests 1000 --input-len 64 \
    --output-len 256 --repeat 2 --timeout 240 --deadline 420 --out "$RES/serve-0.6b" \
    --modes stock:$FAP,plugin:$FAP,v1:$FAP
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

case "$1" in
  start)
    mkdir -p "$RES"
    if [ $# -eq 2 ]; then
      all=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)
      setsid bash "$0" run "$2" "$all" >"$RES/$2.out" 2>&1 </dev/null &
    else
      setsid bash "$0" run "$2" 0,1 >"$RES/$2.out" 2>&1 </dev/null &
      setsid bash "$0" run "$3" 2,3 >"$RES/$3.out" 2>&1 </dev/null &
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
      [ -f "$f" ] && { echo "== $f"; grep -E '^\[|^\{|JOB DONE|agree|Error|servers in' "$f" | cut -c1-400 | tail -25; }
    done
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    # traces stay behind (large); their per-step summaries are in the JSON
    tar -C "$RES" --exclude=traces --exclude=model -czf "$OUT/res.tgz" . && ls -la "$OUT" ;;
esac
