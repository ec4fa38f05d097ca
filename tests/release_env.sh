# Building a virtual environment for one vLLM release with this package (test
# extra) installed from the checkout, editable. Sourced by tests/release_matrix.sh
# and .ci/run; run from the repository root.
#
#   build_env VENV VERSION   a new VENV (python3 -m venv) with VERSION installed
#   install VENV VERSION     vLLM VERSION and this package into an existing VENV
#
# vLLM 0.27+ pins a CUDA build of torch that only the package index serves, so
# pip is run with the index alone: a local wheel folder or extra index in this
# machine's pip configuration could supply a '+cpu' torch instead (README,
# Troubleshooting). Each environment takes about 8 GB and 5 minutes to build.

pip_index() { env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$@"; }

install() {
  pip_index "$1/bin/pip" install -q "vllm==$2" -e ".[test]"
}

build_env() {
  python3 -m venv "$1" && pip_index "$1/bin/pip" install -q --upgrade pip && install "$1" "$2"
}
