#!/usr/bin/env bash
# The first checks of a released vLLM (0.33.0) with this plugin on a GPU host (2 GPUs,
# or one for the one-gpu steps), after the kit's install (README.md, "Run the
# checks"). From the repository root:
#
#   bash benchmarks/gpu_kit/run_checks.sh DIR [STEP...]        run in the foreground
#   bash benchmarks/gpu_kit/run_checks.sh start DIR [STEP...]  the same, detached
#   bash benchmarks/gpu_kit/run_checks.sh wait DIR SECONDS     wait for it (at most
#        SECONDS), print progress, pack DIR into $OUT (or DIR.tgz) without model files
#
# Steps, in this order whatever order they are named in (default: smoke batch):
#   smoke        one GPU, PP=1, eager, stock vLLM: does an engine start (smoke.py)
#   engine-pp1   one GPU, PP=1, Qwen3-4B shape (dummy weights), vLLM's attention choice,
#                --workload engine 256 x 256, 3 timed passes: stock, the plugin enabled,
#                the plugin again, stock again (both orders in one invocation); the
#                plugin must stand aside, so each pair should be level
#   runner-pp1   one GPU, PP=1, random weights: stock then the plugin enabled, each in
#                FULL_AND_PIECEWISE and PIECEWISE (smoke.py); greedy tokens compared
#                per mode, and the plugin must stand aside (every rank's plan record
#                says so and none ran the plugin's runner: runner-pp1.json)
#   batch        PP=2, Qwen3-0.6B shape, random weights, --workload batch: the plugin's
#                greedy tokens against stock's, FULL_AND_PIECEWISE then PIECEWISE;
#                bench.json records plugin_stages and tokens_agree per run
#   batch-pp4    4 GPUs, a GPU per rank: the batch step at PP=4 (vLLM's split)
#   engine-0.6b  PP=2, --workload engine, 0.6B shape (128 x 2 in / 512 out), dummy weights:
#                the plugin, stock and V1, profiled (each stage's GPU busy %)
#   engine-32b   the same for the Qwen3-32B dense shape (256 x 64 in / 256 out)
#   engine-70b, engine-30b-a3b  the same for Llama-3.1-70B (dense) and Qwen3-30B-A3B (MoE)
#   engine-32b-1024  the 32B shape at the load of the served c1,024 cell, offline: 1,024
#                prompts of 64 in / 256 out, max_num_seqs 1024, gpu_memory_utilization
#                0.9, 2 timed passes: the plugin's defaults, stock MRV2, V1 and stock TP=2
#                in one invocation (KIT_ENGINE_MODES, KIT_DEADLINE_S, default 900)
#   direct       PP=2, VLLM_PP_CUDAGRAPH_DIRECT_HANDOFF=1 (no per-step metadata between
#                stages): greedy tokens against stock in FULL_AND_PIECEWISE and eager
#                (batch), then the 0.6B engine cell beside the plugin's defaults and stock
#   serve-32b    PP=2, --workload serve (vllm serve + vllm bench serve), Qwen3-32B dense
#                shape, dummy weights, 64 in / 256 out, concurrency 64 and 256: plugin,
#                stock and V1, each stage's GPU busy % per concurrency (--profile; the
#                cell of ../results/2026-11-23-pipelining-pp2/run.sh); about 15 minutes
#   serve-0.6b, serve-70b, serve-30b-a3b  the same for the other shapes
#                (engine-* and serve-* are the cells of docs/performance.md;
#                each a bench invocation of its own)
#   scoreboard-32b  the 2-GPU scoreboard of the Qwen3-32B dense shape (dummy weights,
#                vLLM's attention choice, gpu_memory_utilization 0.9, max_num_seqs 1024),
#                each cell a bench invocation into its own folder under scoreboard-32b/,
#                in this order: serve-nvlink (the plugin's defaults, stock MRV2 at PP=2
#                and stock at TP=2, one server each, vllm bench serve random 256 out at
#                64 in x concurrency 256 and 1024, then 1024 in x 256), serve-socket
#                (the same runners, --interconnect socket, 64 in x 256), serve-v1 (V1 at
#                PP=2, the points of serve-nvlink), engine-1024 (--workload engine,
#                1024 prompts of 64 in / 256 out: plugin, stock PP, TP). The cells share
#                KIT_DEADLINE_S seconds (default 1500): each gets what the earlier ones
#                left as its --deadline, one left under a minute is skipped, and
#                bench.json is written as each run ends, so a run cut short keeps
#                every finished run
#   scoreboard-ray  the scoreboard's first serve point (64 in x concurrency 256) with the
#                plugin and stock TP=2 over two Ray nodes on this host, one GPU each
#                (ray_nodes.sh; Ray installed first: ../install_ray.sh); plugin_stages
#                in bench.json counts the runner's line from each node's worker
#   ray-pp2      PP=2 over two Ray nodes on this host (ray_nodes.sh; Ray installed first), a
#                stage on each: the plugin and stock served one after the other (Qwen3-32B
#                dense shape, 64 in x concurrency 256, 512 requests, 2 passes); then the
#                second node started on a site without the plugin's package and the plugin
#                served again (0.6B shape): what a user sees (ray-missing-package/), the
#                seconds until the server is gone and what is left on the GPUs
#   links        2 GPUs: NCCL send/recv and all-reduce per message size under each
#                --interconnect (nvlink, host, socket), fitted to the latency and bandwidth
#                plan reads (../tools/link_bench.py; links/links.json); about a minute
#   lanes-32b    4 GPUs: the Qwen3-32B dense shape served at concurrency 1,024 (64 in / 256
#                out, 2,048 requests a pass, 2 passes after a warm-up), two servers side by
#                side (lanes: GPUs 0,1 and 2,3) meeting before each point: plugin | stock,
#                stock | plugin, plugin-balance | stock, stock | plugin-balance;
#                lanes-32b/lanes.md pairs them (KIT_LANE_A / KIT_LANE_B: other runners,
#                the same count in each; KIT_LANE_POINTS: other IN:CONCURRENCY points;
#                KIT_LANE_REQUESTS: requests per pass, 2048 unless given;
#                KIT_DEADLINE_S bounds each lane)
#   lanes-burst-32b  4 GPUs: where stock leaves room, side by side (plugin | stock, stock |
#                plugin): the seed's burst on the 32B shape, 128 requests of 2 tokens at
#                once, 512 out, three passes of two such waves (KIT_DEADLINE_BURST_S;
#                one slot is about 7 minutes, as is one of lanes-0.6b)
#   lanes-0.6b   4 GPUs: the same pairs on the launch-bound 0.6B shape at the lanes-32b
#                cell's load (KIT_DEADLINE_SMALL_S; KIT_SMALL_LANE_A / KIT_SMALL_LANE_B:
#                other runners, as KIT_LANE_A / KIT_LANE_B for lanes-32b; KIT_SMALL_POINTS)
#   lanes-0.6b-api  4 GPUs: lanes-0.6b with KIT_API_SERVERS (4) API servers in front of
#                each engine (vllm serve --api-server-count), plugin | stock, stock |
#                plugin (KIT_API_LANE_A / KIT_API_LANE_B, KIT_API_POINTS, KIT_DEADLINE_API_S)
#                (lanes-0.6b and lanes-0.6b-api serve KIT_SMALL_MODEL instead where set,
#                e.g. qwen3-4b, the other launch-bound shape)
#                Every lanes step takes KIT_MAX_CAPTURE: both lanes capture CUDA graphs up
#                to that many tokens (--max-cudagraph-capture-size; vLLM's is 512 here)
#                and KIT_REQUEST_RATE: requests arrive as a Poisson process at that many
#                per second, each point's concurrency the most in flight (--request-rate),
#                and KIT_INTERCONNECT: the link between the stages (--interconnect)
#   never-slower-32b  2 GPUs: the lanes-32b cell one server at a time: plugin, stock,
#                plugin-balance, stock, plugin (KIT_MODES, KIT_LANE_POINTS, KIT_DEADLINE_S)
#   serve-pair   2 GPUs: served cells for plan's check, each layout in turn on GPUs
#                0,1 (KIT_SMALL_MODEL, KIT_PAIR_POINTS, KIT_PAIR_MODES: plugin, stock, TP)
#   serve-quad   4 GPUs: served cells for plan's check on four GPUs, each layout in turn
#                on GPUs 0-3: the plugin PP=4, stock PP=4 and TP=4, then the plugin and
#                stock at TP=2 x PP=2 (KIT_QUAD_MODEL, default qwen3-32b; KIT_QUAD_POINTS,
#                default 64:256; KIT_QUAD_REQUESTS, default 1024 a pass; KIT_QUAD_PP4_MODES,
#                KIT_QUAD_TP2PP2_MODES; KIT_DEADLINE_QUAD_S bounds each half, default 900)
#   soak-32b     4 GPUs: the serving soak with a GPU per stage, Qwen3-32B dense shape
#                (dummy weights), PP=2: the plugin's defaults on GPUs 0,1 beside stock on
#                2,3, then a second stock server; 10,000 requests each (KIT_SOAK_REQUESTS)
#                of the sampling mix with a quarter structured, a tenth cancelled and
#                some sent to a LoRA adapter, the token check; each server watched under
#                load (GPU memory at the start and the end, every stage's snapshots,
#                requests left: ../tools/soak_watch.py); KIT_SOAK_PLUGIN_RUNNER names
#                the plugin's runner (default plugin; plugin-cadence: vLLM's cadence);
#                KIT_SOAK_ARGS adds soak.py options (for example --no-token-check);
#                KIT_SOAK_GROUPS="0,1" runs it, soak-30b-a3b and soak-preemption-32b
#                on 2 GPUs, one server after another
#   soak-30b-a3b 4 GPUs: the same with Qwen3-30B-A3B, without the adapter
#   soak-32b-pp4 4 GPUs: the same at PP=4, one server at a time on GPUs 0-3
#   soak-preemption-32b  4 GPUs: soak-32b's servers with a KV cache of 512 blocks, so
#                requests are preempted and resumed; 2,000 requests each
#   storm        4 GPUs: aborted and bad requests beside good traffic for a minute; every
#                bad one must get a 4xx, nothing be left running (storm/: a report per
#                server): PP=2 plugin beside stock, then PP=4 plugin and stock
#   faults       4 GPUs: a stage raising inside a step and a stage's worker killed, first
#                and last stage, under load: the plugin on GPUs 0,1 beside stock on 2,3
#                (faults/: a report per fault with the seconds to a clean stop and the
#                error lines a user sees; KIT_FAULT_EXECUTORS="mp ray" adds Ray,
#                KIT_FAULT_STAGES="last first" runs the last stage's faults first)
#   faults-two-nodes  2 GPUs: PP=2 over two Ray nodes on this host (ray_nodes.sh), the
#                plugin's server under load; the second node's stage raises, then (a new
#                server) its worker is killed (faults-two-nodes/: the same reports, and
#                what is left on the GPUs after each); KIT_TWO_NODE_RUNNERS="plugin
#                stock" adds stock's servers, KIT_TWO_NODE_HOWS=kill the kill alone
#   gpu-tests    PP=2, the project's GPU tests (pytest -m gpu: tokens per graph mode,
#                structured outputs, stage faults, a short soak, LoRA, the refusals), with
#                the test-only vLLM plugins; about 30 minutes on 2 H200s
#   shared-batch PP=2 with both stages on GPU 0 of a one-GPU machine (shared_gpu/,
#                test-only; NCCL between the stages over a loopback socket), Qwen3-0.6B
#                shape, random weights, --workload batch: stock, the plugin and the
#                plugin with the direct hand-off in FULL_AND_PIECEWISE, stock and the
#                plugin in PIECEWISE. Tokens and plugin_stages only: no speed
#   shared-modes the same for FULL_DECODE_ONLY and breakable (stock and the plugin,
#                eager the breakable reference) and the direct hand-off in eager
#   shared-restart  start-up, both stages on GPU 0: each runner on fresh caches, then on
#                the same caches (the compile cache reused?), the plugin first, one server
#                at a time (about 9 minutes); shared-restart-reversed: stock first
#   shared-stuck-stage  a stage's worker stopped by SIGSTOP under load: the plugin at
#                PP=2 and TP=2 x PP=2 (stall limit KIT_STALL_LIMIT_S, 20) beside stock at
#                PP=2 (waits out vLLM's 300 s execute timeout; about 7 minutes in all)
#   shared-serve the GPU tests that serve, both stages on GPU 0: structured outputs
#                and a fault in the first and in the last stage (mp executor)
#   shared-moe   Qwen3-30B-A3B (dummy weights, 64 x 128), both stages on GPU 0 (an
#                H200: 61 GB of weights): the plugin on vLLM's cadence against stock
#                in PIECEWISE, FULL_DECODE_ONLY and breakable (against eager)
#   shared-soak-30b-a3b  the serving soak of Qwen3-30B-A3B (dummy weights), both stages
#                on GPU 0 (an H200): 2,000 requests of the sampling mix with a quarter
#                structured outputs, a tenth cancelled, under preemption, with the token
#                check; the plugin's defaults against two stock servers (as the GPU
#                matrix's soak-30b-a3b job on 2 GPUs); about 20 minutes
#   shared-soak-32b  the same soak on the Qwen3-32B dense shape (over 30 minutes there:
#                longer than one run; see KIT_PREVIOUS below)
#   shared-soak-32b-pp4  the LoRA soak of the 32B shape at PP=4, every rank on GPU 0, 1,000
#                requests a server: which kernels compile while serving, on which rank and
#                when (the PP=4 soak's stalls), the plugin beside two stock servers
#   shared-soak-lora  the sampling-mix soak of the 0.6B shape with 3 LoRA adapters served
#                beside it, both stages on GPU 0, with the token check (memory use is
#                not a LoRA finding here: the shim fixes each stage's KV cache)
#   shared-ray-fault  the GPU tests of a fault in the first and in the last stage under
#                the Ray executor, both stages on GPU 0 (Ray installed first:
#                ../install_ray.sh; the shim gives Ray's local cluster a GPU per stage)
#   shared-gpu-tests  gpu-tests with both stages on GPU 0 (as long as gpu-tests or longer)
#   shared-layouts  tests/e2e/test_layouts.py with every rank on GPU 0, in three pytest
#                runs side by side (KIT_LAYOUT_STREAM_1..3 to choose their tests, empty to
#                drop one; on an 80 GB card at most three PP=4 runs fit); on one
#                H200 an engine starts in 2-8 minutes there, so the whole set takes
#                hours: each finished engine is in its test's bench.json (summary.txt).
#                A stream's pytest arguments may name --graph-modes=MODE,... first: its
#                layout tests then run only those graph modes
#                (both: KIT_TESTS="NODE_ID ..." runs only those tests, in that order)
#                (KIT_LAYOUT_GPUS: the GPU of each run, "0 0 0 0" unless set)
#   metrics-cost PP=2, 2 GPUs, --workload engine, 0.6B shape: the plugin with its
#                per-stage metrics and without (VLLM_PP_CUDAGRAPH_METRICS=0), both orders
#   shared-lora  the GPU test of 3 LoRA adapters at --gpu-memory-utilization 0.95, both
#                stages on GPU 0 (the shim fixes each stage's KV cache, so this shows the
#                start, the serving and each stage's graph memory, not the KV sizing)
#   cost-tables  one GPU, alone: the layer-partition cost tables of the shapes that ship
#                none yet, Qwen3-4B, Qwen3-32B and Llama-3.1-70B (../tools/cost_table.py:
#                stock vLLM at PP=1, dummy weights, 4 and 12 layers fitted per batch size;
#                the 30B-A3B shape took 9 minutes on an H100); copy cost-tables/*/*.json into
#                src/vllm_pp_cudagraph/shared/cost_tables/ to ship them. KIT_COST_SHAPES names
#                others (qwen3-0.6b and qwen3-30b-a3b ship already). Then one TP=2 rank's
#                shard of the shapes in KIT_COST_TP_SHAPES (default qwen3-32b
#                llama-3.1-70b; empty for none): the tables plan reads for TP
#                (cost_table.py --tp 2). KIT_COST_BATCHES: the batch sizes (default
#                1,32,64,128,256; add 512,1024 for the loads of the served cells);
#                KIT_COST_SHAPES empty: the TP shards alone; KIT_COST_GPU: the GPU
#                (default 0), so two halves can run side by side on two GPUs
#   stage-cost   one GPU: what one PP=2 stage of the 0.6B, 32B, 70B and 30B-A3B shapes
#                costs per decode step, by batch size and context (../tools/stage_cost.py,
#                stock vLLM at PP=1 with half the layers); about 15 minutes
#   all          smoke, batch, engine-0.6b, engine-32b
#   one-gpu      smoke, runner-pp1
# Every step runs even when an earlier one failed; DIR/steps.txt has each step's exit
# status and seconds, DIR/summary.txt the runs' tokens_agree, plugin_stages and speed.
# The project is installed into the kit's site first (KIT_SITE, default /tmp/site).
# The soaks resume: with KIT_PREVIOUS=FOLDER (an earlier DIR, unpacked and
# carried over), the servers that finished there are not served again.
#
# FlashInfer: vLLM 0.33's sampler uses it by default (JIT-compiled on first use, needs
# nvcc). If the smoke fails with it and passes with VLLM_USE_FLASHINFER_SAMPLER=0, the
# later steps run with that setting, and DIR/notes.txt says so. Setting
# VLLM_USE_FLASHINFER_SAMPLER yourself skips the first try.
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
STEPS="smoke runner-pp1 engine-pp1 links batch batch-pp4 direct shared-restart shared-stuck-stage shared-restart-reversed shared-batch shared-modes shared-serve shared-moe shared-soak-30b-a3b shared-soak-32b shared-soak-32b-pp4 shared-soak-lora shared-ray-fault cost-tables stage-cost shared-lora engine-0.6b engine-32b engine-70b engine-30b-a3b engine-32b-1024 serve-0.6b serve-32b serve-70b serve-30b-a3b scoreboard-32b scoreboard-ray ray-pp2 lanes-32b lanes-burst-32b lanes-0.6b lanes-0.6b-api never-slower-32b serve-pair serve-quad soak-32b soak-30b-a3b soak-32b-pp4 soak-preemption-32b faults faults-two-nodes storm gpu-tests shared-gpu-tests metrics-cost shared-layouts"

usage() { sed -n '2,/^set -u/p' "$self" | grep '^#' >&2; exit 2; }

step_smoke() {
  local d=$RES/smoke
  if [ -z "${VLLM_USE_FLASHINFER_SAMPLER+x}" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout -k 10 360 python3 "$here/smoke.py" "$d" eager 2>&1 \
      | tee "$RES/smoke-default-sampler.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] && return 0
    # Again without FlashInfer's sampler only where FlashInfer is in the failure, or the
    # smoke ran out of time (its JIT build on first use is the likeliest stall).
    if [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && ! grep -qiE \
        'File "[^"]*flashinfer|flashinfer[^ ]*(Error|Exception)|(error|failed)[^.]*flashinfer' \
        "$RES/smoke-default-sampler.log"; then
      return "$rc"
    fi
    echo "smoke failed (exit $rc) in FlashInfer or out of time; again with VLLM_USE_FLASHINFER_SAMPLER=0"
    mv "$d" "$d-default-sampler" 2>/dev/null
    if CUDA_VISIBLE_DEVICES=0 VLLM_USE_FLASHINFER_SAMPLER=0 timeout -k 10 300 \
        python3 "$here/smoke.py" "$d" eager; then
      export VLLM_USE_FLASHINFER_SAMPLER=0
      echo "the smoke passed only with VLLM_USE_FLASHINFER_SAMPLER=0: later steps ran with it" \
        | tee -a "$RES/notes.txt"
      return 0
    fi
    export VLLM_USE_FLASHINFER_SAMPLER=0
    echo "the smoke failed with and without FlashInfer's sampler; later steps ran with" \
      "VLLM_USE_FLASHINFER_SAMPLER=0" | tee -a "$RES/notes.txt"
    return 1
  fi
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 360 python3 "$here/smoke.py" "$d" eager
}

# PP=1 on one GPU: the plugin enabled stands aside, and the tokens are stock's.
step_runner-pp1() {
  local r rc=0
  rm -rf "$RES/pp1-plugin-records"
  for r in stock plugin; do
    # The plugin's ranks leave their plan records where the check below reads them.
    local env=(VLLM_PLUGINS=)
    [ "$r" = plugin ] && env=(VLLM_PLUGINS=pp_cudagraph VLLM_PP_CUDAGRAPH_METRICS_DIR="$RES/pp1-plugin-records")
    env CUDA_VISIBLE_DEVICES=0 "${env[@]}" timeout -k 10 540 python3 "$here/smoke.py" \
      --random-weights "$RES/pp1-$r" full_and_piecewise piecewise 2>&1 | tee "$RES/pp1-$r.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  python3 - "$RES" <<'EOF2' || rc=1
import json, sys
from pathlib import Path
from vllm_pp_cudagraph.shared.snapshots import read_plan_records
res = Path(sys.argv[1])
runs = {r: json.loads((res / f"pp1-{r}/smoke.json").read_text())["runs"]
        for r in ("stock", "plugin") if (res / f"pp1-{r}/smoke.json").exists()}
# One record per rank of each engine the plugin-enabled run built (the engine check's too).
ranks = [r for name, r in read_plan_records(res / "pp1-plugin-records").items()
         if not name.startswith("engine-")]
report = {"plugin_ranks_recorded": len(ranks),
          "ranks_on_the_plugins_runner": sum(bool(r.get("plugin_runner")) for r in ranks),
          "stand_aside": sorted({r.get("stand_aside") or "" for r in ranks}), "modes": {}}
ok = (len(runs) == 2 and ranks and report["ranks_on_the_plugins_runner"] == 0
      and all(r.get("stand_aside") for r in ranks))
for mode in ("full_and_piecewise", "piecewise"):
    s, p = (runs.get(r, {}).get(mode, {}) for r in ("stock", "plugin"))
    agree = bool(s.get("ok") and p.get("ok")) and s["tokens"] == p["tokens"]
    distinct = len({t for seq in s.get("tokens", []) for t in seq})
    report["modes"][mode] = {"stock_ok": s.get("ok"), "plugin_ok": p.get("ok"),
                             "tokens_agree": agree, "distinct_tokens": distinct}
    ok &= agree
report["ok"] = ok
(res / "runner-pp1.json").write_text(json.dumps(report, indent=1))
print("RESULT runner-pp1", json.dumps(report))
sys.exit(0 if ok else 1)
EOF2
  return $rc
}

# Greedy tokens, plugin against stock, batches formed alike (tests/e2e/test_pp_engine.py
# does the same per mode). Stock first in each mode: it is the reference.
step_batch() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload batch --model qwen3-0.6b --weights random \
    --repeat 1 --timeout 360 --deadline 840 --out "$RES/batch-0.6b" \
    --modes stock:$FAP,plugin:$FAP,stock:piecewise,plugin:piecewise
}

step_batch-pp4() {
  CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m vllm_pp_cudagraph.commands.bench --pp 4 --workload batch \
    --model qwen3-0.6b --weights random --repeat 1 --timeout 360 --deadline "${KIT_DEADLINE_PP4_S:-840}" \
    --out "$RES/batch-pp4-0.6b" --modes stock:$FAP,plugin:$FAP,stock:piecewise,plugin:piecewise
}

# The acceptance cells of pipelining that pays: one bench invocation each, the plugin's
# defaults, stock MRV2 and V1 side by side, profiled (each stage's GPU busy %).
# engine_cell SHAPE PROMPTS INPUT_LEN OUTPUT_LEN MAX_NUM_SEQS DEADLINE_S
engine_cell() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload engine --model "$1" --weights dummy \
    --prompts "$2" --input-len "$3" --output-len "$4" --max-num-seqs "$5" --repeat 3 \
    --profile --timeout 600 --deadline "$6" --out "$RES/engine-$1" \
    --modes plugin:$FAP,stock:$FAP,v1:$FAP
}

# serve_cell SHAPE DEADLINE_S: vllm serve + vllm bench serve, 64 in / 256 out,
# concurrency 64 and 256.
serve_cell() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload serve --model "$1" --weights dummy \
    --num-requests 512 --input-len 64 --output-len 256 --max-num-seqs 256 \
    --concurrency 64,256 --repeat 2 --profile --timeout 600 --deadline "$2" \
    --out "$RES/serve-$1" --modes plugin:$FAP,stock:$FAP,v1:$FAP
}

step_engine-pp1() {
  CUDA_VISIBLE_DEVICES=0 python3 -m vllm_pp_cudagraph.commands.bench --pp 1 --workload engine \
    --model qwen3-4b --weights dummy --prompts 256 --input-len 64 --output-len 256 \
    --max-num-seqs 256 --repeat 3 --timeout 600 --deadline 1500 --out "$RES/engine-pp1" \
    --modes stock:$FAP,plugin:$FAP,plugin:$FAP,stock:$FAP
}
step_engine-0.6b() { engine_cell qwen3-0.6b 128 2 512 128 600; }
step_engine-32b() { engine_cell qwen3-32b 256 64 256 256 900; }
step_engine-70b() { engine_cell llama-3.1-70b 256 64 256 256 1200; }
step_engine-30b-a3b() { engine_cell qwen3-30b-a3b 256 64 256 256 900; }
step_engine-32b-1024() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload engine --model qwen3-32b --weights dummy \
    --prompts 1024 --input-len 64 --output-len 256 --max-num-seqs 1024 \
    --gpu-memory-utilization 0.9 --max-model-len 2048 --repeat 2 --timeout 600 \
    --deadline "${KIT_DEADLINE_S:-900}" --out "$RES/engine-32b-1024" \
    --modes "${KIT_ENGINE_MODES:-plugin:$FAP,stock:$FAP,v1:$FAP,tp:$FAP}"
}
step_serve-0.6b() { serve_cell qwen3-0.6b 900; }
step_serve-32b() { serve_cell qwen3-32b 1200; }
step_serve-70b() { serve_cell llama-3.1-70b 1500; }
step_serve-30b-a3b() { serve_cell qwen3-30b-a3b 1200; }

# scoreboard_cell NAME MODES BENCH_ARGS...: one cell of step_scoreboard-32b, its --deadline what
# KIT_DEADLINE_S leaves since the step began (SCOREBOARD_T0).
scoreboard_cell() {
  local name=$1 left=$((${KIT_DEADLINE_S:-1500} - (SECONDS - SCOREBOARD_T0)))
  shift
  if [ "$left" -lt 60 ]; then
    echo "scoreboard-32b $name: skipped, $left s of KIT_DEADLINE_S left"
    return 1
  fi
  local modes=$1
  shift
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --model qwen3-32b --weights dummy --timeout 600 \
    --max-num-seqs 1024 --gpu-memory-utilization 0.9 --deadline "$left" \
    --out "$RES/scoreboard-32b/$name" --modes "$modes" "$@"
}

step_scoreboard-32b() {
  local rc=0 runners=plugin:$FAP,stock:$FAP,tp:$FAP
  SCOREBOARD_T0=$SECONDS
  local serve="--workload serve --num-requests 512 --output-len 256 --repeat 2"
  local points="--points 64:256,64:1024,1024:256"
  # shellcheck disable=SC2086
  {
    scoreboard_cell serve-nvlink $runners $serve $points || rc=1
    scoreboard_cell serve-socket $runners $serve --points 64:256 --interconnect socket || rc=1
    scoreboard_cell serve-v1 v1:$FAP $serve $points || rc=1
    scoreboard_cell engine-1024 $runners --workload engine --prompts 1024 --input-len 64 \
      --output-len 256 --repeat 2 || rc=1
  }
  return $rc
}

step_scoreboard-ray() {
  local rc=0
  if ! bash "$here/ray_nodes.sh" start > "$RES/ray-nodes.txt" 2>&1; then
    cat "$RES/ray-nodes.txt"
    return 1
  fi
  RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} $BENCH --model qwen3-32b --weights dummy \
    --timeout 600 --max-num-seqs 1024 --gpu-memory-utilization 0.9 --executor ray \
    --deadline "${KIT_DEADLINE_S:-1500}" --out "$RES/scoreboard-ray" \
    --modes plugin:$FAP,tp:$FAP --workload serve --num-requests 512 --output-len 256 \
    --repeat 2 --points 64:256 || rc=1
  bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
  return $rc
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
  local rc=0 t0 bare
  if ! bash "$here/ray_nodes.sh" start > "$RES/ray-nodes.txt" 2>&1; then
    cat "$RES/ray-nodes.txt"
    return 1
  fi
  RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} $BENCH --model qwen3-32b --weights dummy \
    --timeout 600 --max-num-seqs 1024 --gpu-memory-utilization 0.9 --executor ray \
    --deadline 600 --out "$RES/ray-pp2" --modes plugin:$FAP,stock:$FAP --workload serve \
    --num-requests 512 --output-len 256 --repeat 2 --points 64:256 || rc=1
  bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
  bare=$(site_without_plugin)
  RAY_SECOND_NODE_PYTHONPATH=$bare bash "$here/ray_nodes.sh" start >> "$RES/ray-nodes.txt" 2>&1
  t0=$SECONDS
  RAY_ADDRESS=127.0.0.1:${RAY_PORT:-6379} $BENCH --model qwen3-0.6b --weights dummy \
    --timeout 300 --executor ray --deadline 360 --out "$RES/ray-missing-package" \
    --modes plugin:$FAP --workload serve --num-requests 64 --output-len 16 --points 64:16
  echo "ray-missing-package: bench exit $? after $((SECONDS - t0)) s"
  echo "left on the GPUs:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
  bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
  return $rc
}

step_links() {
  python3 -m benchmarks.tools.link_bench --out "$RES/links"
}

# lanes NAME MODES_A MODES_B BENCH_ARGS...: two bench invocations side by side on a 4-GPU
# host, lane a on GPUs 0,1 and lane b on 2,3, each with its own port, VLLM_PORT base and
# output, meeting before each serve point (bench --lane-sync), so the k-th runner of each
# lane is measured in the same minutes; ../tools/lanes_report.py pairs them (lanes.md).
# tagged TAG COMMAND...: COMMAND's output, each line ending "  (TAG)"; COMMAND's status.
# Two of them in the background, one per GPU pair, serve side by side.
tagged() {
  local tag=$1
  shift
  (set -o pipefail; "$@" 2>&1 | sed -u "s/\$/  ($tag)/")
}

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

# The never-slower cell: Qwen3-32B dense shape, served at concurrency 1,024 (64 in / 256
# out), each plugin runner beside stock or another plugin runner in both lane orders.
step_lanes-32b() {
  local a=${KIT_LANE_A:-plugin:$FAP,stock:$FAP,plugin-balance:$FAP,stock:$FAP}
  local b=${KIT_LANE_B:-stock:$FAP,plugin:$FAP,stock:$FAP,plugin-balance:$FAP}
  # shellcheck disable=SC2086
  lanes lanes-32b "$a" "$b" --model qwen3-32b $SERVED \
    --num-requests "${KIT_LANE_REQUESTS:-2048}" --output-len 256 --repeat 2 \
    --points "${KIT_LANE_POINTS:-64:1024}" --deadline "${KIT_DEADLINE_S:-1500}"
}

# Where stock leaves room, side by side in both lane orders (plugin | stock, stock |
# plugin): the seed's burst on the 32B shape (128 requests of 2 tokens at once, 512 out,
# one prefill cohort; a pass sends twice the concurrency, so two such waves), and the
# launch-bound 0.6B shape at the never-slower cell's load.
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
# The same with several API servers in front of each engine, so that one API server's
# process does not bound what the engine shows.
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

# The same cell on 2 GPUs, one server at a time: the plugin's defaults, stock, the plugin
# fixed on balance (the old default's steady state), stock, the plugin again, so each plugin
# runner has stock beside it in time (KIT_MODES: other runners).
step_never-slower-32b() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --model qwen3-32b $SERVED \
    --num-requests 2048 --output-len 256 --repeat 2 --points "${KIT_LANE_POINTS:-64:1024}" \
    --deadline "${KIT_DEADLINE_S:-1500}" --out "$RES/never-slower-32b" \
    --modes "${KIT_MODES:-plugin:$FAP,stock:$FAP,plugin-balance:$FAP,stock:$FAP,plugin:$FAP}"
}

# Served cells for plan's check on a 2-GPU host: each layout in turn on GPUs 0,1, one
# server at a time (KIT_SMALL_MODEL, KIT_PAIR_POINTS, KIT_PAIR_MODES). Each run is a cell
# of plan's model, not a ratio between runners: they ran at different minutes.
step_serve-pair() {
  local model=${KIT_SMALL_MODEL:-qwen3-0.6b}
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --tp 1 --port 8000 --model "$model" $SERVED \
    --num-requests "${KIT_PAIR_REQUESTS:-1024}" --output-len 256 \
    --repeat 2 --api-server-count 4 --points "${KIT_PAIR_POINTS:-64:64}" \
    --deadline "${KIT_DEADLINE_PAIR_S:-900}" --out "$RES/serve-pair-$model" \
    --modes "${KIT_PAIR_MODES:-plugin:$FAP,stock:$FAP,tp:$FAP}"
}

# Served cells for plan's check on a 4-GPU host, one server at a time on GPUs 0-3: PP=4
# (the plugin, stock) and TP=4, then TP=2 x PP=2 (the plugin, stock). As serve-pair, each
# run is a cell of plan's model, not a ratio between runners.
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

# What the per-stage metrics cost: the plugin with and without them, in both orders, the
# 0.6B shape (launch-bound, where the cost shows most), a GPU per stage.
step_metrics-cost() {
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload engine --model qwen3-0.6b --weights dummy \
    --prompts 128 --input-len 2 --output-len 512 --max-num-seqs 128 --repeat 3 \
    --timeout 300 --deadline 420 --out "$RES/metrics-cost-0.6b" \
    --modes plugin:$FAP,plugin-no-metrics:$FAP,plugin-no-metrics:$FAP,plugin:$FAP
}

step_direct() {
  local rc=0
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload batch --model qwen3-0.6b --weights random \
    --repeat 1 --timeout 360 --deadline 720 --out "$RES/direct-batch-0.6b" \
    --modes stock:$FAP,plugin-direct:$FAP,stock:eager,plugin-direct:eager || rc=1
  CUDA_VISIBLE_DEVICES=0,1 $BENCH --workload engine --model qwen3-0.6b --weights dummy \
    --prompts 128 --input-len 2 --output-len 512 --max-num-seqs 128 --repeat 3 \
    --timeout 300 --deadline 540 --out "$RES/direct-engine-0.6b" \
    --modes plugin-direct:$FAP,plugin:$FAP,stock:$FAP || rc=1
  return $rc
}

# The GPU tests' test-only vLLM plugins, into the kit's site.
install_test_plugins() {
  python3 -m pip install -q --no-deps --no-build-isolation --no-index --upgrade \
    --target "$site" tests/e2e/soak_plugins 2>&1 | grep -v 'already exists'
}

# Every rank on GPU 0 (shared_gpu/sitecustomize.py; KIT_GPU names another): for one-GPU machines. KIT_SHARED_GPU_STAGES
# (default 2) is the most ranks an engine may have (TP x PP). FlashInfer's sampler is off unless
# set: its JIT build on first use, in the last stage only, can outlast the engine's start-up
# time limit while the other stages wait for it.
shared() {
  CUDA_VISIBLE_DEVICES=${KIT_GPU:-0} PYTHONPATH="$here/shared_gpu:$site" \
    KIT_SHARED_GPU_STAGES=${KIT_SHARED_GPU_STAGES:-2} \
    VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0} "$@"
}

step_shared-batch() {
  shared $BENCH --workload batch --model qwen3-0.6b --weights random --repeat 1 \
    --timeout 360 --deadline 900 --out "$RES/shared-batch-0.6b" \
    --modes stock:$FAP,plugin:$FAP,plugin-direct:$FAP,stock:piecewise,plugin:piecewise
}

step_shared-modes() {
  shared $BENCH --workload batch --model qwen3-0.6b --weights random --repeat 1 \
    --timeout 360 --deadline 900 --out "$RES/shared-modes-0.6b" \
    --modes stock:full_decode_only,plugin:full_decode_only,stock:eager,plugin:breakable,plugin-direct:eager
}

step_shared-moe() {
  shared $BENCH --workload batch --model qwen3-30b-a3b --weights dummy --prompts 64 \
    --input-len 32 --output-len 128 --max-num-seqs 64 --repeat 1 --timeout 360 \
    --deadline 1500 --out "$RES/shared-moe-30b-a3b" \
    --modes stock:piecewise,plugin-cadence:piecewise,stock:full_decode_only,plugin-cadence:full_decode_only,stock:eager,plugin-cadence:breakable
}

step_shared-serve() {
  install_test_plugins
  shared python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$RES/shared-serve" \
    --junitxml "$RES/shared-serve.xml" -k "structured or (stage_fault and not ray)" tests
}

# Start-up as an operator restarting a server sees it (../tools/restart_check.py): each
# runner on fresh caches, then on the same caches again, one server at a time; the
# plugin first (shared-restart) or stock first (shared-restart-reversed).
step_shared-restart() {
  shared python3 -m benchmarks.tools.restart_check --out "$RES/shared-restart" \
    --order "${KIT_RESTART_ORDER:-plugin,stock}" --port 9700
}
step_shared-restart-reversed() {
  shared python3 -m benchmarks.tools.restart_check --out "$RES/shared-restart-reversed" \
    --order stock,plugin --port 9700
}

# A stage's worker stopped by SIGSTOP under load (../tools/serve_checks.py --how stop):
# stock's server at PP=2 (given vLLM's 300 s execute timeout and a minute more) beside
# the plugin's at PP=2, then the plugin's at TP=2 x PP=2, each with a stall limit of
# KIT_STALL_LIMIT_S (20) and KIT_STALL_LIMIT_S + 10 s to exit.
step_shared-stuck-stage() {
  install_test_plugins
  local limit=${KIT_STALL_LIMIT_S:-20} rc=0 out="$RES/shared-stuck-stage"
  shared python3 -m benchmarks.tools.serve_checks fault --out "$out" --runner stock \
    --stage last --how stop --exit-within 360 --beside --port 9710 \
    >"$out-stock.txt" 2>&1 &
  local stock=$!
  sleep 5
  shared python3 -m benchmarks.tools.serve_checks fault --out "$out" --runner plugin \
    --stage last --how stop --stall-limit "$limit" --exit-within $((limit + 10)) --beside \
    --port 9720 || rc=1
  KIT_SHARED_GPU_STAGES=4 shared python3 -m benchmarks.tools.serve_checks fault --out "$out" \
    --runner plugin --stage first --tp 2 --how stop --stall-limit "$limit" \
    --exit-within $((limit + 10)) --beside --port 9730 || rc=1
  wait $stock
  cat "$out-stock.txt"
  return $rc
}

shared_soak() {
  install_test_plugins
  shared python3 -m benchmarks.tools.soak --out "$RES/shared-soak-$1" --shape "qwen3-$1" \
    --modes full_and_piecewise --sampling-mix --structured --preemption --token-check \
    --gpus 0 --port 9600 --resume
}
step_shared-soak-30b-a3b() { shared_soak 30b-a3b; }
step_shared-soak-32b() { shared_soak 32b; }
# The 32B soak at PP=4 with every rank on one GPU: behaviour only (which kernels compile
# while serving, on which rank and when: jit_compiles in soak.json), the plugin beside two
# stock servers, LoRA and the sampling mix as in soak-32b-pp4 (KIT_SOAK_REQUESTS, 1000).
step_shared-soak-32b-pp4() {
  install_test_plugins
  KIT_SHARED_GPU_STAGES=4 shared python3 -m benchmarks.tools.soak --out "$RES/shared-soak-32b-pp4" \
    --pp 4 --gpus 0 --shape qwen3-32b --lora 1 --modes full_and_piecewise --sampling-mix \
    --structured --requests "${KIT_SOAK_REQUESTS:-1000}" --port 9700 --resume
}

# gpu_soak NAME PP GPU-GROUP... [soak options]: the soak with a GPU per stage.
gpu_soak() {
  local name=$1 pp=$2
  shift 2
  local groups=()
  while [ $# -gt 0 ] && [[ $1 != --* ]]; do groups+=("$1"); shift; done
  install_test_plugins
  python3 -m benchmarks.tools.soak --out "$RES/$name" --pp "$pp" --gpus "${groups[@]}" \
    --modes full_and_piecewise --sampling-mix --structured --token-check \
    --requests "${KIT_SOAK_REQUESTS:-10000}" --gpu-memory-utilization 0.9 --port 9800 \
    --plugin-runner "${KIT_SOAK_PLUGIN_RUNNER:-plugin}" --resume "$@" ${KIT_SOAK_ARGS:-}
}
# KIT_SOAK_GROUPS="0,1": the PP=2 soaks on a 2-GPU host, one server after another.
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

# faults: a stage that raises inside a step and a stage's worker killed (SIGKILL),
# first and last stage, under load, with a GPU per stage: the plugin on GPUs 0,1 beside
# stock on 2,3 (../tools/serve_checks.py fault; KIT_FAULT_EXECUTORS="mp ray" adds Ray
# where it is installed). Each report has the seconds to a clean stop and the log's
# error lines.
# KIT_FAULT_CASES="executor:stage:how ..." (e.g. "ray:first:raise mp:last:kill") runs
# those cases only, in that order; how "kill-engine" kills the engine core instead, as
# vLLM's API server does when it shuts down, to see whether the workers outlive it.
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
    # Under Ray each server starts a cluster of its own (RAY_ADDRESS=local): the two
    # lanes run at once, and neither may join the other's.
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

# A stage on the second of two Ray nodes fails under load (ray_nodes.sh: the head owns
# GPU 0, the second node GPU 1; RAY_ADDRESS makes vLLM's Ray executor use them).
# KIT_TWO_NODE_RUNNERS (default plugin; "plugin stock" adds stock's server, one after
# the other) and KIT_TWO_NODE_HOWS (default "raise kill") choose the cases.
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
      echo "left on the GPUs after $runner $how:"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
      bash "$here/ray_nodes.sh" stop >> "$RES/ray-nodes.txt" 2>&1
    done
  done
  return $rc
}

# storm: aborted and bad requests beside good traffic (../tools/serve_storm.py), a GPU per
# stage: PP=2, the plugin on GPUs 0,1 beside stock on 2,3; then PP=4 on GPUs 0-3, the
# plugin then stock.
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

step_shared-soak-lora() {
  shared python3 -m benchmarks.tools.soak --out "$RES/shared-soak-lora" --lora 3 \
    --modes full_and_piecewise --sampling-mix --token-check --gpus 0 --port 9700 --resume
}

step_shared-ray-fault() {
  if ! python3 -c "import ray" 2>/dev/null; then
    echo "Ray is not installed: bash benchmarks/install_ray.sh, once per part (gpu_kit/README.md)"
    return 1
  fi
  install_test_plugins
  shared python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$RES/shared-ray-fault" \
    --junitxml "$RES/shared-ray-fault.xml" -k "stage_fault_under_ray" tests
}

step_shared-gpu-tests() {
  shared step_gpu-tests
}

# The layout tests, every rank on GPU 0, in three pytest runs side by side (each with a
# copy of the kit's site): an engine takes minutes to start there, so one run would take
# hours. KIT_LAYOUT_STREAM_1..3 (pytest node ids) replace a run's tests, set but empty
# drop that run; a fourth run takes KIT_LAYOUT_STREAM_4 where set.
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
  # KIT_TESTS: the tests to run, as pytest node ids in the order to run them (default: all).
  # shellcheck disable=SC2086
  python3 -m pytest -m gpu -rs -v -p no:cacheprovider --basetemp "$RES/gpu-tests" \
    --junitxml "$RES/gpu-tests.xml" ${KIT_TESTS:-tests}
}

summary() {
  python3 - "$RES" <<'EOF' >"$RES/summary.txt" 2>&1
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
for name in ("smoke/smoke.json", "smoke-default-sampler/smoke.json", "pp1-stock/smoke.json",
             "pp1-plugin/smoke.json"):
    path = res / name
    if path.exists():
        smoke = json.loads(path.read_text())
        for mode, run in smoke["runs"].items():
            print(f"{name.split('/')[0]}: {mode} ok={run['ok']} init_s={run.get('init_s')} "
                  f"env={smoke['env']} {run.get('error', '')[:300]}")
if (res / "runner-pp1.json").exists():
    print("runner-pp1:", (res / "runner-pp1.json").read_text().replace("\n", ""))
for path in sorted([*res.glob("*/bench.json"), *res.glob("scoreboard-*/*/bench.json"),
                    *res.glob("gpu-tests/**/bench.json")]):
    for run in json.loads(path.read_text())["runs"]:
        spec = run["spec"]
        keys = ("input_len", "concurrency", "plugin_stages", "direct_handoff_stages", "tokens_verdict",
                "tokens_agree",
                "tokens_reference", "requests_differ", "repeats_itself", "req_per_s",
                "tpot_mean_ms", "tpot_p50_ms", "ttft_p50_ms", "output_tok_per_s", "init_s", "capture_s", "returncode")
        row = " ".join(f"{k}={run[k]}" for k in keys if k in run)
        layout = f" tp={spec['tp']} pp={spec['pp']}" if spec.get("tp", 1) > 1 else ""
        print(f"{path.parent.relative_to(res)}: {spec['runner']}:{spec['mode']}{layout} "
              f"{'ok' if run.get('digest') else 'FAILED'} {row}")
EOF
}

run_all() {
  RES=$1; shift
  mkdir -p "$RES"
  local want=" ${*:-smoke batch} "
  [ "$want" = " all " ] && want=" smoke batch engine-0.6b engine-32b "
  [ "$want" = " one-gpu " ] && want=" smoke runner-pp1 "
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
    { echo "on the GPUs before $s:"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; } >>"$RES/steps.txt" 2>&1
    local t0=$SECONDS
    # Not a pipe: the smoke step may export VLLM_USE_FLASHINFER_SAMPLER for the later ones.
    "step_$s" > >(tee "$RES/$s.txt") 2>&1
    local rc=$?
    echo "$s rc=$rc ${VLLM_USE_FLASHINFER_SAMPLER:+VLLM_USE_FLASHINFER_SAMPLER=$VLLM_USE_FLASHINFER_SAMPLER }$((SECONDS - t0))s" \
      | tee -a "$RES/steps.txt"
    { echo "left on the GPUs after $s:"
      nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; } >>"$RES/steps.txt" 2>&1
    summary
  done
  summary
  echo "CHECKS DONE" | tee -a "$RES/steps.txt"
}

case "${1:-}" in
  ""|-h|--help) usage ;;
  start)
    [ $# -ge 2 ] || usage
    if grep -qs 'CHECKS DONE' "$2/steps.txt"; then
      # A host kept from an earlier run still holds that run: set it aside, so this
      # run's pack holds only its own files.
      mv "$2" "$2.before-$(date +%s)" && echo "an earlier run's $2 set aside"
    fi
    mkdir -p "$2"
    setsid bash "$self" "${@:2}" >"$2/console.txt" 2>&1 </dev/null &
    sleep 2; echo "started: $2/console.txt" ;;
  wait)
    [ $# -eq 3 ] || usage
    RES=$2; end=$((SECONDS + $3))
    if [ ! -e "$RES/console.txt" ]; then
      # A fresh host comes back bare: nothing to wait for.
      echo "no run in $RES: nothing was started there on this machine (a fresh one?)" >&2
      exit 3
    fi
    while [ $SECONDS -lt $end ] && ! grep -qs 'CHECKS DONE' "$RES/steps.txt"; do sleep 10; done
    summary  # the runs finished so far, a step still running included
    cat "$RES/steps.txt" 2>/dev/null
    grep -hE '^===|^\[|^    [0-9.]+ req/s|^    (FAILED|STOPPED)|^RESULT|^\{"mode"|TOKENS DIFFER|PLUGIN NOT LOADED|DIRECT HAND-OFF NOT ON|^[A-Za-z]*Error|smoke failed|rc=|::[^ ]+ (PASSED|FAILED|SKIPPED|ERROR)|^=+ .*(passed|failed|error)' \
      "$RES/console.txt" 2>/dev/null | cut -c1-300 | tail -40
    cat "$RES/summary.txt" 2>/dev/null
    pack=${OUT:-$(dirname "$RES")}
    tar -C "$RES" --exclude=model --exclude=traces --exclude='*.safetensors' -czf "$pack/checks.tgz" . \
      && cp "$RES/summary.txt" "$RES/steps.txt" "$pack/" 2>/dev/null
    ls -la "$pack/checks.tgz"
    grep -qs 'CHECKS DONE' "$RES/steps.txt" && echo "ALL STEPS DONE" || echo "STILL RUNNING" ;;
  *) run_all "$@" ;;
esac
