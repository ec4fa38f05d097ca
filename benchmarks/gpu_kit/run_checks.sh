#!/usr/bin/env bash
# The GPU checks the committed results ran (../results/*/run.sh), on a GPU host after the
# kit's install (README.md, "Run the checks"). From the repository root:
#
#   bash benchmarks/gpu_kit/run_checks.sh DIR STEP...        run in the foreground
#   bash benchmarks/gpu_kit/run_checks.sh start DIR STEP...  the same, detached
#   bash benchmarks/gpu_kit/run_checks.sh wait DIR SECONDS   wait for it (at most SECONDS),
#        print progress, pack DIR without model files into checks.tgz in $OUT (else beside DIR)
#
# It installs the project into the kit's site (KIT_SITE, default /tmp/site), then runs the
# named steps in STEPS' order, each even when one before failed: DIR/steps.txt has each
# one's exit status and seconds, DIR/summary.txt every bench run's tokens_agree,
# plugin_stages and speed. The soaks resume: with KIT_PREVIOUS=FOLDER (an earlier DIR,
# carried back), the servers that finished there are not served again. The steps:
#
# A GPU per rank:
#   engine-pp1   1 GPU, PP=1, Qwen3-4B, --workload engine: the plugin stands aside, level with stock
#   links        2 GPUs: NCCL send/recv and all-reduce per message size and --interconnect,
#                fitted to what plan reads (../tools/link_bench.py)
#   batch-pp4    4 GPUs, PP=4: the plugin's greedy tokens against stock's (KIT_DEADLINE_PP4_S)
#   cost-tables  1 GPU: cost tables of KIT_COST_SHAPES, then TP=2 shards of KIT_COST_TP_SHAPES
#                (../tools/cost_table.py; KIT_COST_BATCHES, KIT_COST_GPU)
#   stage-cost   1 GPU: one PP=2 stage's cost per decode step by shape (../tools/stage_cost.py)
#   ray-pp2      2 GPUs, two Ray nodes on this host (ray_nodes.sh): the 32B shape served by
#                the plugin and stock; then the plugin with a node lacking its package
#   lanes-32b    4 GPUs: the 32B shape at c1,024, two servers side by side in both orders
#                (KIT_LANE_A, KIT_LANE_B, KIT_LANE_POINTS, KIT_LANE_REQUESTS, KIT_DEADLINE_S)
#   lanes-burst-32b  4 GPUs: 128 requests at once, 512 out, side by side (KIT_DEADLINE_BURST_S)
#   lanes-0.6b   lanes-32b's pairs on KIT_SMALL_MODEL (qwen3-0.6b) (KIT_SMALL_LANE_A,
#                KIT_SMALL_LANE_B, KIT_SMALL_POINTS, KIT_DEADLINE_SMALL_S)
#   lanes-0.6b-api  lanes-0.6b with KIT_API_SERVERS (4) API servers per engine, so one API
#                process does not bound it (KIT_API_LANE_A, KIT_API_LANE_B, KIT_API_POINTS,
#                KIT_DEADLINE_API_S). Every lanes step takes KIT_MAX_CAPTURE, KIT_REQUEST_RATE,
#                KIT_INTERCONNECT (--max-cudagraph-capture-size, --request-rate, --interconnect)
#   never-slower-32b  2 GPUs: the lanes-32b cell one server at a time (KIT_MODES,
#                KIT_LANE_POINTS, KIT_DEADLINE_S)
#   serve-pair   2 GPUs: plan's served cells, each layout in turn (KIT_SMALL_MODEL,
#                KIT_PAIR_MODES, KIT_PAIR_POINTS, KIT_PAIR_REQUESTS, KIT_DEADLINE_PAIR_S)
#   serve-quad   4 GPUs: PP=4 and TP=4, then TP=2 x PP=2, in turn (KIT_QUAD_MODEL, KIT_QUAD_POINTS,
#                KIT_QUAD_REQUESTS, KIT_QUAD_PP4_MODES, KIT_QUAD_TP2PP2_MODES, KIT_DEADLINE_QUAD_S)
#   soak-32b     4 GPUs: the serving soak (../tools/soak.py), 32B shape at PP=2 with a LoRA
#                adapter: the plugin beside stock, then a second stock server
#   soak-30b-a3b 4 GPUs: the same on Qwen3-30B-A3B, without the adapter
#   soak-32b-pp4 4 GPUs: soak-32b at PP=4, one server at a time
#   soak-preemption-32b  4 GPUs: soak-32b's servers on 512 KV blocks, 2,000 requests each
#                The soaks take KIT_SOAK_REQUESTS (10,000), KIT_SOAK_PLUGIN_RUNNER (plugin),
#                KIT_SOAK_ARGS (more soak.py options); KIT_SOAK_GROUPS="0,1": PP=2 on 2 GPUs
#   faults       4 GPUs: a stage raising or killed under load, the plugin beside stock
#                (../tools/serve_checks.py; KIT_FAULT_EXECUTORS="mp ray" adds Ray; KIT_FAULT_STAGES;
#                KIT_FAULT_CASES="EXECUTOR:STAGE:HOW ..." runs those, HOW also stop, kill-engine)
#   faults-two-nodes  2 GPUs, two Ray nodes: the second node's stage fails under load
#                (KIT_TWO_NODE_RUNNERS, default plugin; KIT_TWO_NODE_HOWS, "raise kill")
#   storm        4 GPUs: aborted and bad requests beside good traffic (../tools/serve_storm.py)
#   gpu-tests    the GPU tests, pytest -m gpu (KIT_TESTS="NODE_ID ...": those, in that order)
#   metrics-cost 2 GPUs: the plugin with and without its per-stage metrics, 0.6B (launch-bound)
#
# Every rank on GPU KIT_GPU (0) through shared_gpu/ (test-only; KIT_SHARED_GPU_STAGES: the
# most ranks an engine has, 2): tokens and behaviour, no speed.
#   shared-restart  cold then warm start-up (../tools/restart_check.py; KIT_RESTART_ORDER;
#                KIT_RESTART_STARTS=cold: the cold starts alone)
#   shared-restart-reversed  the same, stock first
#   shared-stuck-stage  a stage SIGSTOPped under load, plugin beside stock (KIT_STALL_LIMIT_S, 20;
#                KIT_STUCK_STOCK=0: the plugin's servers alone)
#   shared-batch greedy tokens against stock's in FULL_AND_PIECEWISE and PIECEWISE (and direct)
#   shared-modes the same in FULL_DECODE_ONLY, breakable and eager
#   shared-soak-32b-pp4  the 32B LoRA soak at PP=4 (KIT_SOAK_REQUESTS, 1000)
#   shared-lora  the GPU test of 3 LoRA adapters at --gpu-memory-utilization 0.95
#   shared-gpu-tests  gpu-tests (KIT_TESTS)
#   shared-layouts  tests/e2e/test_layouts.py in up to four pytest runs side by side, as one
#                would take hours (KIT_LAYOUT_STREAM_1..4, set but empty: no run; KIT_LAYOUT_GPUS;
#                KIT_LAYOUT_KV_GIB: each stage's KV cache here alone, so the streams fit together)
set -u
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
here=$(dirname "$self")
cd "$here/../.."
site=${KIT_SITE:-/tmp/site}
export PYTHONPATH=$site PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BENCH="python3 -m vllm_pp_cudagraph.commands.bench --pp 2"
FAP=full_and_piecewise
#: What the served cells of the lanes, never-slower, serve-pair and serve-quad steps share.
SERVED="--weights dummy --max-num-seqs 1024 --gpu-memory-utilization 0.9 --max-model-len 2048 --timeout 600 --workload serve"
#: Every step, in the order they run.
STEPS="engine-pp1 links batch-pp4 shared-restart shared-stuck-stage shared-restart-reversed shared-batch shared-modes shared-soak-32b-pp4 cost-tables stage-cost shared-lora ray-pp2 lanes-32b lanes-burst-32b lanes-0.6b lanes-0.6b-api never-slower-32b serve-pair serve-quad soak-32b soak-30b-a3b soak-32b-pp4 soak-preemption-32b faults faults-two-nodes storm gpu-tests shared-gpu-tests metrics-cost shared-layouts"

usage() { sed -n '2,/^set -u/p' "$self" | grep '^#' >&2; exit 2; }
no_steps() { echo "name the steps to run after DIR" >&2; usage; }
gpu_apps() { echo "$1"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; }

step_batch-pp4() {
  CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m vllm_pp_cudagraph.commands.bench --pp 4 --workload batch \
    --model qwen3-0.6b --weights random --repeat 1 --timeout 360 --deadline "${KIT_DEADLINE_PP4_S:-840}" \
    --out "$RES/batch-pp4-0.6b" --modes stock:$FAP,plugin:$FAP,stock:piecewise,plugin:piecewise
}

step_engine-pp1() {
  CUDA_VISIBLE_DEVICES=0 python3 -m vllm_pp_cudagraph.commands.bench --pp 1 --workload engine \
    --model qwen3-4b --weights dummy --prompts 256 --input-len 64 --output-len 256 \
    --max-num-seqs 256 --repeat 3 --timeout 600 --deadline 1500 --out "$RES/engine-pp1" \
    --modes stock:$FAP,plugin:$FAP,plugin:$FAP,stock:$FAP
}

# A site without the plugin's package: links to every entry of the kit's site but its own.
site_without_plugin() {
  local bare=/tmp/site-without-plugin entry
  rm -rf "$bare" && mkdir -p "$bare"
  for entry in "$site"/*; do
    case $(basename "$entry") in vllm_pp_cudagraph*) ;; *) ln -s "$entry" "$bare/" ;; esac
  done
  echo "$bare"
}

step_ray-pp2() {
  local rc=0 t0
  if ! bash "$here/ray_nodes.sh" start > "$RES/ray-nodes.txt" 2>&1; then
    cat "$RES/ray-nodes.txt"
    return 1
  fi
  RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} $BENCH --model qwen3-32b --weights dummy \
    --timeout 600 --max-num-seqs 1024 --gpu-memory-utilization 0.9 --executor ray \
    --deadline 600 --out "$RES/ray-pp2" --modes plugin:$FAP,stock:$FAP --workload serve \
    --num-requests 512 --output-len 256 --repeat 2 --points 64:256 || rc=1
  bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
  RAY_SECOND_NODE_PYTHONPATH=$(site_without_plugin) bash "$here/ray_nodes.sh" start >> "$RES/ray-nodes.txt" 2>&1
  t0=$SECONDS
  RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} $BENCH --model qwen3-0.6b --weights dummy \
    --timeout 300 --executor ray --deadline 360 --out "$RES/ray-missing-package" \
    --modes plugin:$FAP --workload serve --num-requests 64 --output-len 16 --points 64:16
  echo "ray-missing-package: bench exit $? after $((SECONDS - t0)) s"
  gpu_apps "left on the GPUs:"
  bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
  return $rc
}

step_links() { python3 -m benchmarks.tools.link_bench --out "$RES/links"; }

# tagged TAG COMMAND...: COMMAND's output, each line ending "  (TAG)"; COMMAND's status.
tagged() {
  (set -o pipefail; "${@:2}" 2>&1 | sed -u "s/\$/  ($1)/")
}

# lanes NAME MODES_A MODES_B BENCH_ARGS...: two benches side by side, lane a on GPUs 0,1 and
# lane b on 2,3, meeting before each serve point (--lane-sync) so the k-th runners of the two
# lanes share their minutes; ../tools/lanes_report.py pairs them (lanes.md).
lanes() {
  local name=$1 modes_a=$2 modes_b=$3 dir=$RES/$1 rc=0
  shift 3
  mkdir -p "$dir"
  set -- "$@" ${KIT_MAX_CAPTURE:+--max-cudagraph-capture-size "$KIT_MAX_CAPTURE"} \
    ${KIT_REQUEST_RATE:+--request-rate "$KIT_REQUEST_RATE"} \
    ${KIT_INTERCONNECT:+--interconnect "$KIT_INTERCONNECT"}
  CUDA_VISIBLE_DEVICES=0,1 VLLM_PORT=29500 tagged "lane a" $BENCH --port 8000 \
    --out "$dir/lane-a" --modes "$modes_a" --lane-sync "$dir/sync" --lane a "$@" &
  local lane_a=$!
  CUDA_VISIBLE_DEVICES=2,3 VLLM_PORT=29700 tagged "lane b" $BENCH --port 8100 \
    --out "$dir/lane-b" --modes "$modes_b" --lane-sync "$dir/sync" --lane b "$@" &
  wait $lane_a || rc=1
  wait $! || rc=1
  python3 benchmarks/tools/lanes_report.py "$dir" || rc=1
  return $rc
}

step_lanes-32b() {
  local a=${KIT_LANE_A:-plugin:$FAP,stock:$FAP,plugin-balance:$FAP,stock:$FAP}
  local b=${KIT_LANE_B:-stock:$FAP,plugin:$FAP,stock:$FAP,plugin-balance:$FAP}
  # shellcheck disable=SC2086
  lanes lanes-32b "$a" "$b" --model qwen3-32b $SERVED \
    --num-requests "${KIT_LANE_REQUESTS:-2048}" --output-len 256 --repeat 2 \
    --points "${KIT_LANE_POINTS:-64:1024}" --deadline "${KIT_DEADLINE_S:-1500}"
}

step_lanes-burst-32b() {
  # shellcheck disable=SC2086
  lanes lanes-burst-32b "plugin:$FAP,stock:$FAP" "stock:$FAP,plugin:$FAP" --model qwen3-32b \
    $SERVED --num-requests 128 --output-len 512 --repeat 3 \
    --points 2:128 --deadline "${KIT_DEADLINE_BURST_S:-900}"
}
step_lanes-0.6b() {
  small_lanes lanes-0.6b "${KIT_SMALL_LANE_A:-plugin:$FAP,stock:$FAP}" \
    "${KIT_SMALL_LANE_B:-stock:$FAP,plugin:$FAP}" --points "${KIT_SMALL_POINTS:-64:1024}" \
    --deadline "${KIT_DEADLINE_SMALL_S:-900}"
}
step_lanes-0.6b-api() {
  small_lanes lanes-0.6b-api "${KIT_API_LANE_A:-plugin:$FAP,stock:$FAP}" \
    "${KIT_API_LANE_B:-stock:$FAP,plugin:$FAP}" --api-server-count "${KIT_API_SERVERS:-4}" \
    --points "${KIT_API_POINTS:-64:1024}" --deadline "${KIT_DEADLINE_API_S:-900}"
}
small_lanes() {
  # shellcheck disable=SC2086
  lanes "$1" "$2" "$3" --model "${KIT_SMALL_MODEL:-qwen3-0.6b}" $SERVED \
    --num-requests 2048 --output-len 256 --repeat 2 "${@:4}"
}

step_never-slower-32b() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --model qwen3-32b $SERVED \
    --num-requests 2048 --output-len 256 --repeat 2 --points "${KIT_LANE_POINTS:-64:1024}" \
    --deadline "${KIT_DEADLINE_S:-1500}" --out "$RES/never-slower-32b" \
    --modes "${KIT_MODES:-plugin:$FAP,stock:$FAP,plugin-balance:$FAP,stock:$FAP,plugin:$FAP}"
}

step_serve-pair() {
  local model=${KIT_SMALL_MODEL:-qwen3-0.6b}
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --tp 1 --port 8000 --model "$model" $SERVED \
    --num-requests "${KIT_PAIR_REQUESTS:-1024}" --output-len 256 \
    --repeat 2 --api-server-count 4 --points "${KIT_PAIR_POINTS:-64:64}" \
    --deadline "${KIT_DEADLINE_PAIR_S:-900}" --out "$RES/serve-pair-$model" \
    --modes "${KIT_PAIR_MODES:-plugin:$FAP,stock:$FAP,tp:$FAP}"
}

step_serve-quad() {
  local rc=0 model=${KIT_QUAD_MODEL:-qwen3-32b}
  # shellcheck disable=SC2086
  set -- --model "$model" $SERVED --num-requests "${KIT_QUAD_REQUESTS:-1024}" \
    --output-len 256 --repeat 2 --points "${KIT_QUAD_POINTS:-64:256}" \
    --deadline "${KIT_DEADLINE_QUAD_S:-900}"
  CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m vllm_pp_cudagraph.commands.bench --pp 4 --tp 1 "$@" \
    --out "$RES/serve-quad-$model-pp4" \
    --modes "${KIT_QUAD_PP4_MODES:-plugin:$FAP,stock:$FAP,tp:$FAP}" || rc=1
  CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m vllm_pp_cudagraph.commands.bench --pp 2 --tp 2 "$@" \
    --out "$RES/serve-quad-$model-tp2pp2" \
    --modes "${KIT_QUAD_TP2PP2_MODES:-plugin:$FAP,stock:$FAP}" || rc=1
  return $rc
}

step_metrics-cost() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload engine --model qwen3-0.6b --weights dummy \
    --prompts 128 --input-len 2 --output-len 512 --max-num-seqs 128 --repeat 3 \
    --timeout 300 --deadline 420 --out "$RES/metrics-cost-0.6b" \
    --modes plugin:$FAP,plugin-no-metrics:$FAP,plugin-no-metrics:$FAP,plugin:$FAP
}

# The GPU tests' test-only vLLM plugins, into the kit's site.
install_test_plugins() {
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade \
    --target "$site" tests/e2e/soak_plugins 2>&1 | grep -v 'already exists'
}

# shared COMMAND...: every rank on GPU KIT_GPU (shared_gpu/sitecustomize.py). FlashInfer's
# sampler is off unless set: its JIT build in the last stage can outlast the others' start-up.
shared() {
  CUDA_VISIBLE_DEVICES=${KIT_GPU:-0} PYTHONPATH="$here/shared_gpu:$site" \
    KIT_SHARED_GPU_STAGES=${KIT_SHARED_GPU_STAGES:-2} \
    VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0} "$@"
}

shared_batch() {
  shared $BENCH --workload batch --model qwen3-0.6b --weights random --repeat 1 \
    --timeout 360 --deadline 900 --out "$RES/$1-0.6b" --modes "$2"
}
step_shared-batch() {
  shared_batch shared-batch stock:$FAP,plugin:$FAP,plugin-direct:$FAP,stock:piecewise,plugin:piecewise
}
step_shared-modes() {
  shared_batch shared-modes \
    stock:full_decode_only,plugin:full_decode_only,stock:eager,plugin:breakable,plugin-direct:eager
}

restart() {
  shared python3 -m benchmarks.tools.restart_check --out "$RES/$1" --order "$2" --port 9700 \
    --starts "${KIT_RESTART_STARTS:-cold,warm}"
}
step_shared-restart() { restart shared-restart "${KIT_RESTART_ORDER:-plugin,stock}"; }
step_shared-restart-reversed() { restart shared-restart-reversed stock,plugin; }

step_shared-stuck-stage() {
  install_test_plugins
  local limit=${KIT_STALL_LIMIT_S:-20} rc=0 out="$RES/shared-stuck-stage"
  local check=(python3 -m benchmarks.tools.serve_checks fault --out "$out" --how stop --beside)
  local stock=
  if [ "${KIT_STUCK_STOCK:-1}" != 0 ]; then
    # Stock is given vLLM's 300 s execute timeout and a minute more to exit.
    shared "${check[@]}" --runner stock --stage last --exit-within 360 --port 9710 \
      >"$out-stock.txt" 2>&1 &
    stock=$!
    sleep 5
  fi
  shared "${check[@]}" --runner plugin --stage last --stall-limit "$limit" \
    --exit-within $((limit + 10)) --port 9720 || rc=1
  KIT_SHARED_GPU_STAGES=4 shared "${check[@]}" --runner plugin --stage first --tp 2 \
    --stall-limit "$limit" --exit-within $((limit + 10)) --port 9730 || rc=1
  if [ -n "$stock" ]; then wait $stock; cat "$out-stock.txt"; fi
  return $rc
}

step_shared-soak-32b-pp4() {
  install_test_plugins
  KIT_SHARED_GPU_STAGES=4 shared python3 -m benchmarks.tools.soak --out "$RES/shared-soak-32b-pp4" \
    --pp 4 --gpus 0 --shape qwen3-32b --lora 1 --modes full_and_piecewise --sampling-mix \
    --structured --requests "${KIT_SOAK_REQUESTS:-1000}" --port 9700 --resume
}

# gpu_soak NAME PP GPU-GROUP... [soak options]: the soak with a GPU per stage.
gpu_soak() {
  local name=$1 pp=$2 groups=()
  shift 2
  while [ $# -gt 0 ] && [[ $1 != --* ]]; do groups+=("$1"); shift; done
  install_test_plugins
  python3 -m benchmarks.tools.soak --out "$RES/$name" --pp "$pp" --gpus "${groups[@]}" \
    --modes full_and_piecewise --sampling-mix --structured --token-check \
    --requests "${KIT_SOAK_REQUESTS:-10000}" --gpu-memory-utilization 0.9 --port 9800 \
    --plugin-runner "${KIT_SOAK_PLUGIN_RUNNER:-plugin}" --resume "$@" ${KIT_SOAK_ARGS:-}
}
pp2_groups=${KIT_SOAK_GROUPS:-0,1 2,3}
# shellcheck disable=SC2086
step_soak-32b() { gpu_soak soak-32b 2 $pp2_groups --shape qwen3-32b --lora 1; }
# shellcheck disable=SC2086
step_soak-30b-a3b() { gpu_soak soak-30b-a3b 2 $pp2_groups --shape qwen3-30b-a3b; }
step_soak-32b-pp4() { gpu_soak soak-32b-pp4 4 0,1,2,3 --shape qwen3-32b --lora 1; }
step_soak-preemption-32b() {
  # shellcheck disable=SC2086
  KIT_SOAK_REQUESTS=2000 gpu_soak soak-preemption-32b 2 $pp2_groups --shape qwen3-32b \
    --preemption
}

fault_cases() {
  if [ -n "${KIT_FAULT_CASES:-}" ]; then echo "$KIT_FAULT_CASES"; return; fi
  local executor stage how
  for executor in ${KIT_FAULT_EXECUTORS:-mp}; do
    for stage in ${KIT_FAULT_STAGES:-first last}; do
      for how in raise kill; do echo "$executor:$stage:$how"; done
    done
  done
}
fault_lane() {
  local runner=$1 gpus=$2 port=$3 rc=0 case executor stage how
  for case in $(fault_cases); do
    IFS=: read -r executor stage how <<<"$case"
    # Under Ray each lane's server starts a cluster of its own, so neither joins the other's.
    env $([ "$executor" = ray ] && echo RAY_ADDRESS=local) \
      python3 -m benchmarks.tools.serve_checks fault --out "$RES/faults" --runner "$runner" \
      --gpus "$gpus" --port "$port" --stage "$stage" --how "$how" \
      $([ "$executor" = ray ] && echo --ray) || rc=1
  done
  return $rc
}
step_faults() {
  install_test_plugins
  local rc=0
  tagged plugin fault_lane plugin 0,1 8400 &
  local plugin=$!
  VLLM_PORT=29800 tagged stock fault_lane stock 2,3 8500 &
  wait $plugin || rc=1
  wait $! || rc=1
  return $rc
}

step_faults-two-nodes() {
  install_test_plugins
  local rc=0 runner how
  for runner in ${KIT_TWO_NODE_RUNNERS:-plugin}; do
    for how in ${KIT_TWO_NODE_HOWS:-raise kill}; do
      if ! bash "$here/ray_nodes.sh" start >> "$RES/ray-nodes.txt" 2>&1; then
        tail -20 "$RES/ray-nodes.txt"
        return 1
      fi
      RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} python3 -m benchmarks.tools.serve_checks fault \
        --out "$RES/faults-two-nodes" --runner "$runner" --gpus 0,1 --port 8400 \
        --stage last --how "$how" --ray || rc=1
      gpu_apps "left on the GPUs after $runner $how:"
      bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
    done
  done
  return $rc
}

step_storm() {
  local rc=0 storm="python3 -m benchmarks.tools.serve_storm --out $RES/storm"
  tagged plugin $storm --runner plugin --pp 2 --gpus 0,1 --port 8600 &
  local plugin=$!
  VLLM_PORT=29800 tagged stock $storm --runner stock --pp 2 --gpus 2,3 --port 8700 &
  wait $plugin || rc=1
  wait $! || rc=1
  $storm --runner plugin --pp 4 --gpus 0,1,2,3 --port 8600 || rc=1
  $storm --runner stock --pp 4 --gpus 0,1,2,3 --port 8700 || rc=1
  return $rc
}

step_shared-gpu-tests() { shared step_gpu-tests; }

step_shared-layouts() {
  local L=tests/e2e/test_layouts.py T B i pids=() rc=0
  T=$L::test_layout_serves_stocks_tokens_in_every_graph_mode
  B=$L::test_attention_backend_serves_stocks_tokens
  local streams=(
    "${KIT_LAYOUT_STREAM_1-$T[pp4-8776] $T[pp4] $T[pp1]}"
    "${KIT_LAYOUT_STREAM_2-$T[pp3] $T[pp3-light-last] $B[FLASHINFER]}"
    "${KIT_LAYOUT_STREAM_3-$T[tp2xpp2] $B[TRITON_ATTN] $B[FLASH_ATTN] $T[pp4-light-last]}"
    "${KIT_LAYOUT_STREAM_4:-}")
  mkdir -p "$RES/gpu-tests"  # pytest makes --basetemp but not its parent
  local gpus=(${KIT_LAYOUT_GPUS:-0 0 0 0})
  for i in 0 1 2 3; do
    [ -n "${streams[$i]}" ] || continue
    [ -d "$site-layouts-$i" ] || cp -a "$site" "$site-layouts-$i"
    # shellcheck disable=SC2086
    (site="$site-layouts-$i" KIT_SHARED_GPU_STAGES=4 KIT_GPU=${gpus[$i]:-0} \
      KIT_SHARED_GPU_KV_GIB=${KIT_LAYOUT_KV_GIB:-${KIT_SHARED_GPU_KV_GIB:-4}} \
      shared python3 -m pytest -m gpu -rs -v -p no:cacheprovider \
      --basetemp "$RES/gpu-tests/layouts-$i" --junitxml "$RES/layouts-$i.xml" ${streams[$i]} \
      >"$RES/layouts-$i.txt" 2>&1) &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
  grep -hE '::[^ ]+ (PASSED|FAILED|SKIPPED|ERROR)' "$RES"/layouts-*.txt
  return $rc
}

step_shared-lora() {
  shared python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$RES/shared-lora" \
    --junitxml "$RES/shared-lora.xml" -k "lora_adapters_at_high_memory" tests
}

step_cost-tables() {
  local shape rc=0 batches=${KIT_COST_BATCHES:-1,32,64,128,256}
  for shape in ${KIT_COST_SHAPES-qwen3-4b qwen3-32b llama-3.1-70b}; do
    CUDA_VISIBLE_DEVICES=${KIT_COST_GPU:-0} python3 -m benchmarks.tools.cost_table --batches "$batches" \
      --out "$RES/cost-tables/$shape" --shape "$shape" || rc=1
  done
  for shape in ${KIT_COST_TP_SHAPES-qwen3-32b llama-3.1-70b}; do
    CUDA_VISIBLE_DEVICES=${KIT_COST_GPU:-0} python3 -m benchmarks.tools.cost_table --tp 2 --batches "$batches" \
      --out "$RES/cost-tables/$shape-tp2" --shape "$shape" || rc=1
  done
  return $rc
}

step_stage-cost() {
  CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.tools.stage_cost --out "$RES/stage-cost" --timeout 600
}

step_gpu-tests() {
  install_test_plugins
  # shellcheck disable=SC2086
  python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$RES/gpu-tests" \
    --junitxml "$RES/gpu-tests.xml" ${KIT_TESTS:-tests}
}

summary() {
  python3 - "$RES" <<'EOF' >"$RES/summary.txt" 2>&1
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
for path in sorted([*res.glob("*/bench.json"), *res.glob("gpu-tests/**/bench.json")]):
    for run in json.loads(path.read_text())["runs"]:
        spec = run["spec"]
        keys = ("input_len", "concurrency", "plugin_stages", "direct_handoff_stages", "tokens_verdict",
                "tokens_agree", "tokens_reference", "requests_differ", "repeats_itself", "req_per_s",
                "tpot_mean_ms", "tpot_p50_ms", "ttft_p50_ms", "output_tok_per_s", "init_s", "capture_s", "returncode")
        row = " ".join(f"{k}={run[k]}" for k in keys if k in run)
        layout = f" tp={spec['tp']} pp={spec['pp']}" if spec.get("tp", 1) > 1 else ""
        print(f"{path.parent.relative_to(res)}: {spec['runner']}:{spec['mode']}{layout} "
              f"{'ok' if run.get('digest') else 'FAILED'} {row}")
EOF
}

run_all() {
  RES=$1; shift
  [ $# -gt 0 ] || no_steps
  mkdir -p "$RES"
  local want=" $* "
  for s in $want; do
    case " $STEPS " in *" $s "*) ;; *) echo "unknown step $s" >&2; usage ;; esac
  done
  {
    date -u +"start %FT%TZ"
    nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
    echo "steps:$want"
  } | tee "$RES/host.txt"
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade \
    --target "$site" . 2>&1 | grep -v 'already exists' | tee "$RES/install-project.txt"
  VLLM_PLUGINS=pp_cudagraph python3 -m vllm_pp_cudagraph.commands.cli check >"$RES/check.txt" 2>&1
  echo "vllm-pp-cudagraph check: exit $? (check.txt)" | tee -a "$RES/host.txt"
  if [ -n "${KIT_PREVIOUS:-}" ]; then
    (cd "$KIT_PREVIOUS" && find . -path '*/servers/*.json' -exec cp --parents {} "$RES/" \;)
    echo "servers finished before (KIT_PREVIOUS): $(cd "$RES" && find . -path '*/servers/*.json' | sort | tr '\n' ' ')" \
      | tee -a "$RES/host.txt"
  fi
  : >"$RES/steps.txt"
  for s in $STEPS; do
    case $want in *" $s "*) ;; *) continue ;; esac
    echo "=== step $s ($(date -u +%T))"
    # Another job on the GPUs moves a step's timings, and its compiled-mode tokens.
    gpu_apps "on the GPUs before $s:" >>"$RES/steps.txt" 2>&1
    local t0=$SECONDS
    "step_$s" > >(tee "$RES/$s.txt") 2>&1
    local rc=$?
    echo "$s rc=$rc ${VLLM_USE_FLASHINFER_SAMPLER:+VLLM_USE_FLASHINFER_SAMPLER=$VLLM_USE_FLASHINFER_SAMPLER }$((SECONDS - t0))s" \
      | tee -a "$RES/steps.txt"
    gpu_apps "left on the GPUs after $s:" >>"$RES/steps.txt" 2>&1
    summary
  done
  summary
  echo "CHECKS DONE" | tee -a "$RES/steps.txt"
}

case "${1:-}" in
  ""|-h|--help) usage ;;
  start)
    [ $# -ge 2 ] || usage
    [ $# -ge 3 ] || no_steps
    # A host kept from an earlier run: set that run aside, so this run's pack holds only its own.
    if grep -qs 'CHECKS DONE' "$2/steps.txt"; then
      mv "$2" "$2.before-$(date +%s)" && echo "an earlier run's $2 set aside"
    fi
    mkdir -p "$2"
    setsid bash "$self" "${@:2}" >"$2/console.txt" 2>&1 </dev/null &
    sleep 2; echo "started: $2/console.txt" ;;
  wait)
    [ $# -eq 3 ] || usage
    RES=$2; end=$((SECONDS + $3))
    if [ ! -e "$RES/console.txt" ]; then
      echo "no run in $RES: nothing was started there on this machine (a fresh one?)" >&2
      exit 3
    fi
    while [ $SECONDS -lt $end ] && ! grep -qs 'CHECKS DONE' "$RES/steps.txt"; do sleep 10; done
    summary  # the runs finished so far, a step still running included
    cat "$RES/steps.txt" 2>/dev/null
    grep -hE '^===|^\[|^    [0-9.]+ req/s|^    (FAILED|STOPPED)|^\{"mode"|TOKENS DIFFER|PLUGIN NOT LOADED|DIRECT HAND-OFF NOT ON|^[A-Za-z]*Error|rc=|::[^ ]+ (PASSED|FAILED|SKIPPED|ERROR)|^=+ .*(passed|failed|error)' \
      "$RES/console.txt" 2>/dev/null | cut -c1-300 | tail -40
    cat "$RES/summary.txt" 2>/dev/null
    pack=${OUT:-$(dirname "$RES")}
    tar -C "$RES" --exclude=model --exclude=traces --exclude='*.safetensors' -czf "$pack/checks.tgz" . \
      && cp "$RES/summary.txt" "$RES/steps.txt" "$pack/" 2>/dev/null
    ls -la "$pack/checks.tgz"
    grep -qs 'CHECKS DONE' "$RES/steps.txt" && echo "ALL STEPS DONE" || echo "STILL RUNNING" ;;
  *) run_all "$@" ;;
esac
