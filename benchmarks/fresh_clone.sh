#!/usr/bin/env bash
# The README's install and test commands, copied from it as written, in a fresh clone:
# what a new user does first. Then `check`, two refused `bench` calls and every example
# on a machine without GPUs or a server. Prints each command,
# the end of its output, its exit status and how long it took; every command's whole
# output is kept in DIR.logs/.
#   usage: benchmarks/fresh_clone.sh REPO DIR [BRANCH]   (DIR must not exist yet)
set -u
repo=${1:?usage: benchmarks/fresh_clone.sh REPO DIR [BRANCH]}
dir=${2:?usage: benchmarks/fresh_clone.sh REPO DIR [BRANCH]}
logs=$dir.logs
mkdir -p "$logs"
git clone -q ${3:+--branch "$3"} "$repo" "$dir" && cd "$dir" || exit 1
echo "clone of $(git rev-parse --short HEAD) on $(nproc) cores, $(uname -sm), $(python3 --version)"
echo
# The Install section's first code block, then the Test section's (its install line and
# the test command .ci/run runs), each line as written.
mapfile -t commands < <(awk '/^## Install/ {on=1} on && /^```/ {n++; next} on && n == 1' README.md)
mapfile -t -O ${#commands[@]} commands < <(awk '/^## Test/ {on=1} on && /^```/ {n++; next} on && n == 1' README.md)
commands+=("vllm-pp-cudagraph check" "vllm-pp-cudagraph bench --pp 0 --out /tmp/fresh-clone-bench"
  "vllm-pp-cudagraph bench --pp 2 --model /nonexistent --out /tmp/fresh-clone-bench"
  "python examples/offline_pp2.py" "python examples/direct_runner.py ./no-such-model"
  "python examples/openai_client.py --url http://127.0.0.1:9" "bash examples/serve_pp2.sh")
i=0
for command in "${commands[@]}"; do
  i=$((i + 1))
  echo "\$ $command"
  start=$SECONDS
  eval "$command" >"$logs/$i.log" 2>&1
  rc=$?
  grep -v "^W[0-9]\{4\} \|Failed to import from vllm._C" "$logs/$i.log" | tail -n 12
  echo "[exit $rc, $((SECONDS - start)) s]"
  echo
done
ls -d /tmp/fresh-clone-bench 2>/dev/null || echo "(bench wrote nothing: /tmp/fresh-clone-bench does not exist)"
du -sh .venv 2>/dev/null
