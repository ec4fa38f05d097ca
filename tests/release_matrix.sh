#!/usr/bin/env bash
# Runs the CPU test suite against each supported vLLM release, each in a
# virtual environment of its own, and writes one summary table.
#
# usage: tests/release_matrix.sh OUT_DIR [VERSION ...]
#   (default versions: every supported release, 0.26.0 through 0.33.0)
# env:   MATRIX_ENVS=DIR  where the environments live (default: a temporary dir)
#        KEEP_ENVS=1      keep each environment after its run (about 8 GB each);
#                         an environment found in MATRIX_ENVS is reused
#
# vLLM 0.27+ pins a CUDA build of torch 2.13 that only the package index
# serves, so pip is run with the index alone (no local wheel mirror or config).
# Each environment takes about 8 GB and 5 minutes to build; without KEEP_ENVS
# each is removed after its run. Per release OUT_DIR gets the install log, the
# output of `vllm-pp-cudagraph check` and of pytest; summary.md collects them.
#
# vLLM 0.33.0 requires certifi>=2026.10.19, newer than any certifi the package
# index reachable from our CI and dev machines serves, so its requirements cannot
# be resolved there (users on the open internet resolve them). For such a release
# (listed in FLOOR_UNMET below with the requirement to leave out) the environment
# gets the newest certifi available, vLLM itself with --no-deps, then every other
# requirement read from the installed vLLM's own metadata, and this package
# without dependencies (they are all there by then): pip would otherwise resolve
# vLLM's certifi floor again for the editable install.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tests/release_matrix.sh OUT_DIR [VERSION ...]}
shift
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.26.0 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 0.33.0)
envs=${MATRIX_ENVS:-$(mktemp -d)}
mkdir -p "$out" "$envs"
pip_index() { env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$@"; }
declare -A FLOOR_UNMET=([0.33.0]=certifi)

# vLLM's requirements for this platform, from its installed metadata, less $1.
read_requirements='
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
for line in requires("vllm"):
    req = Requirement(line)
    if req.name.lower() != sys.argv[1] and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(line)
'

# install VENV VERSION: vLLM and this package (test extra) into VENV.
install() {
  local venv=$1 v=$2 skip=${FLOOR_UNMET[$2]:-}
  if [ -z "$skip" ]; then
    pip_index "$venv/bin/pip" install -q "vllm==$v" -e ".[test]"
    return
  fi
  echo "vLLM $v: its '$skip' requirement is left unresolved (see the comment above)"
  pip_index "$venv/bin/pip" install -q --upgrade "$skip" packaging \
    && pip_index "$venv/bin/pip" install -q --no-deps "vllm==$v" \
    && "$venv/bin/python" -c "$read_requirements" "$skip" > "$venv/vllm-requirements.txt" \
    && pip_index "$venv/bin/pip" install -q -r "$venv/vllm-requirements.txt" pytest \
    && pip_index "$venv/bin/pip" install -q --no-deps -e .
}

summary="$out/summary.md"
[ -f "$summary" ] || printf '| vLLM | torch | pytest | check exit |\n|---|---|---|---|\n' > "$summary"
for v in "${versions[@]}"; do
  venv="$envs/$v"
  if [ ! -x "$venv/bin/python" ]; then
    echo "== vLLM $v: building $venv"
    python3 -m venv "$venv" && pip_index "$venv/bin/pip" install -q --upgrade pip \
      && install "$venv" "$v" > "$out/install-$v.log" 2>&1
    if [ $? -ne 0 ]; then
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
