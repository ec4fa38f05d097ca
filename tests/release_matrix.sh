#!/usr/bin/env bash
# Runs the CPU test suite against each supported vLLM release, each in a
# virtual environment of its own, and writes one summary table.
#
# usage: tests/release_matrix.sh OUT_DIR [VERSION ...]
#   (default versions: every supported release, 0.29.0 through 0.33.0)
# env:   MATRIX_ENVS=DIR  where the environments live (default: a temporary dir)
#        KEEP_ENVS=1      keep each environment after its run (about 8 GB each);
#                         an environment found in MATRIX_ENVS is reused
#
# Each environment is built by tests/release_env.sh (about 8 GB and 5 minutes;
# vLLM 0.33.0 through its no-deps path, see there); without KEEP_ENVS each is
# removed after its run. Per release OUT_DIR gets the install log, the output of
# `vllm-pp-cudagraph check` and of pytest; summary.md collects them.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tests/release_matrix.sh OUT_DIR [VERSION ...]}
shift
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.33.0 0.32.0 0.31.0 0.30.0 0.29.0)
envs=${MATRIX_ENVS:-$(mktemp -d)}
mkdir -p "$out" "$envs"
. tests/release_env.sh

summary="$out/summary.md"
[ -f "$summary" ] || printf '| vLLM | torch | pytest | check exit |\n|---|---|---|---|\n' > "$summary"
for v in "${versions[@]}"; do
  venv="$envs/$v"
  if [ ! -x "$venv/bin/python" ]; then
    echo "== vLLM $v: building $venv"
    if ! build_env "$venv" "$v" > "$out/install-$v.log" 2>&1; then
      echo "| $v | - | install failed (install-$v.log) | - |" >> "$summary"
      [ "${KEEP_ENVS:-0}" = 1 ] || rm -rf "$venv"
      continue
    fi
  else
    echo "== vLLM $v: reusing $venv"
    pip_index "$venv/bin/pip" install -q --no-deps -e . > "$out/install-$v.log" 2>&1
  fi
  torch=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)
  VLLM_PLUGINS=pp_cudagraph "$venv/bin/vllm-pp-cudagraph" check > "$out/check-$v.txt" 2>&1
  check_rc=$?
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs tests > "$out/pytest-$v.txt" 2>&1
  result=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$out/pytest-$v.txt" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//')
  echo "| $v | $torch | ${result:-no result (pytest-$v.txt)} | $check_rc |" >> "$summary"
  echo "   $v: ${result:-no result}"
  [ "${KEEP_ENVS:-0}" = 1 ] || rm -rf "$venv"
done
cat "$summary"
