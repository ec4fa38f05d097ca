#!/usr/bin/env bash
# Serve MODEL at pipeline-parallel size 2 with vllm-pp-cudagraph, query it with
# the OpenAI client (openai_client.py), then stop the server.
# Needs 2 NVIDIA GPUs. MODEL is a hub name or a local directory.
#
#   examples/serve_pp2.sh [MODEL] [more `vllm serve` arguments...]
#   VLLM="python -m vllm.entrypoints.cli.main" examples/serve_pp2.sh ...  # no `vllm` on PATH
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=${1:-Qwen/Qwen3-0.6B}
shift || true
port=${PORT:-8000}

VLLM_PLUGINS=pp_cudagraph ${VLLM:-vllm} serve "$model" --served-model-name demo \
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
python3 "$here/openai_client.py" --base-url "http://127.0.0.1:$port/v1" --model demo
