# Building a virtual environment for one vLLM release with this package (test
# extra) installed from the checkout. Sourced by tests/release_matrix.sh and
# .ci/run; run from the repository root.
#
#   build_env VENV VERSION   a new VENV (python3 -m venv) with VERSION installed
#   install VENV VERSION     vLLM VERSION and this package into an existing VENV
#
# vLLM 0.27+ pins a CUDA build of torch 2.13 that only the package index
# serves, so pip is run with the index alone (no local wheel mirror or config).
# Each environment takes about 8 GB and 5 minutes to build.
#
# vLLM 0.33.0 requires certifi>=2026.10.19, newer than any certifi the package
# index reachable from our CI and dev machines serves, so its requirements cannot
# be resolved there (users on the open internet resolve them). For such a release
# (listed in FLOOR_UNMET below with the requirement to leave out) the environment
# gets the newest certifi available, vLLM itself with --no-deps, then every other
# requirement read from the installed vLLM's own metadata, and this package
# without dependencies (they are all there by then): pip would otherwise resolve
# vLLM's certifi floor again for the editable install.

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

install() {
  local venv=$1 v=$2 skip=${FLOOR_UNMET[$2]:-}
  if [ -z "$skip" ]; then
    pip_index "$venv/bin/pip" install -q "vllm==$v" -e ".[test]"
    return
  fi
  echo "vLLM $v: its '$skip' requirement is left unresolved (see tests/release_env.sh)"
  pip_index "$venv/bin/pip" install -q --upgrade "$skip" packaging \
    && pip_index "$venv/bin/pip" install -q --no-deps "vllm==$v" \
    && "$venv/bin/python" -c "$read_requirements" "$skip" > "$venv/vllm-requirements.txt" \
    && pip_index "$venv/bin/pip" install -q -r "$venv/vllm-requirements.txt" pytest \
    && pip_index "$venv/bin/pip" install -q --no-deps -e .
}

build_env() {
  python3 -m venv "$1" && pip_index "$1/bin/pip" install -q --upgrade pip && install "$1" "$2"
}
