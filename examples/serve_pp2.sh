#!/usr/bin/env bash
# Serve MODEL at pipeline-parallel size 2 with vllm-pp-cudagraph, query it with
# the OpenAI client (openai_client.py), then stop the server.
# Needs 2 NVIDIA GPUs and vLLM. MODEL is a hub name or a local directory.
#
#   examples/serve_pp2.sh [MODEL] [more `vllm serve` arguments...]
#   VLLM="python -m vllm.entrypoints.cli.main" examples/serve_pp2.sh ...  # no `vllm` on PATH
#   PORT=8001 examples/serve_pp2.sh ...  # another port than 8000
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
refuse() { echo "serve_pp2.sh: $*" >&2; exit 1; }
case ${1:-} in -h|--help) sed -n '2,8s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
model=${1:-Qwen/Qwen3-0.6B}
shift || true
port=${PORT:-8000}
vllm=${VLLM:-vllm}

command -v "${vllm%% *}" >/dev/null ||
  refuse "${vllm%% *} is not on PATH. Install vLLM with: pip install \"vllm==0.33.0\" (or activate its environment)"
case $model in
  /*|./*|../*|\~*) [ -e "${model/#\~/$HOME}" ] || refuse "the model directory $model does not exist." \
    "Give an existing directory or a Hugging Face hub name such as Qwen/Qwen3-0.6B." ;;
esac
gpus=0
if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true); fi
[ "$gpus" -ge 2 ] || refuse "this example needs 2 NVIDIA GPUs (--pipeline-parallel-size 2);" \
  "$gpus visible (nvidia-smi -L). Run it on a machine with 2 GPUs."

VLLM_PLUGINS=pp_cudagraph $vllm serve "$model" --served-model-name demo \
  --pipeline-parallel-size 2 --port "$port" --max-model-len 1024 "$@" &
server=$!
trap 'kill -INT "$server" 2>/dev/null; wait "$server"' EXIT

python3 - "$port" "$server" <<'PY'
import sys, time, urllib.request, os
port, pid = sys.argv[1], int(sys.argv[2])
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        sys.exit(0)
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            sys.exit("the server exited before it was ready")
        time.sleep(2)
sys.exit("the server was not ready after 20 minutes")
PY
python3 "$here/openai_client.py" --url "http://127.0.0.1:$port" --model demo
