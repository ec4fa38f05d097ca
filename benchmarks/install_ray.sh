#!/usr/bin/env bash
# Ray on a GPU machine without package access, for the Ray runs of the serving checks and
# the GPU test of a stage fault under Ray. Ray's wheel is larger than one transfer, so
# it travels split in two folders, each carried by its own call:
#   bash benchmarks/install_ray.sh --prepare .kit/ray [VERSION]   # beforehand, with the
#        package index: downloads Ray (default 2.60.0) for the machines' Python 3.12 and
#        splits it into .kit/ray/p1 and .kit/ray/p2. Its dependencies are in the image.
#   bash benchmarks/install_ray.sh .kit/ray/p1   # on the GPU machine: stashes the first part
#   bash benchmarks/install_ray.sh .kit/ray/p2   # second part + checksum: assembles, installs
set -euo pipefail
if [[ ${1:-} == --prepare ]]; then
  out=${2:?usage: install_ray.sh --prepare DIR [VERSION]} version=${3:-2.60.0}
  tmp=$(mktemp -d)
  env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null python3 -m pip \
    download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 -d "$tmp" "ray==$version"
  wheel=$(cd "$tmp" && ls ray-*.whl)
  mkdir -p "$out/p1" "$out/p2"
  (cd "$tmp" && sha256sum "$wheel" >ray.sha256 && split -n 2 "$wheel" ray.whl.part-)
  mv "$tmp/ray.whl.part-aa" "$out/p1/"
  mv "$tmp/ray.whl.part-ab" "$tmp/ray.sha256" "$out/p2/"
  rm -rf "$tmp"
  du -sh "$out"/p1 "$out"/p2
  exit 0
fi
stash=/tmp/ray-parts
mkdir -p "$stash"
cp "$1"/* "$stash"/
if [[ -f $stash/ray.sha256 && -f $stash/ray.whl.part-aa && -f $stash/ray.whl.part-ab ]]; then
  wheel=$(awk '{print $2}' "$stash/ray.sha256")
  cat "$stash"/ray.whl.part-* >"$stash/$wheel"
  (cd "$stash" && sha256sum -c ray.sha256)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$stash"/*.whl
  PYTHONPATH=/tmp/site python3 -c "import ray; print('ray', ray.__version__)"
else
  echo "stashed $(ls "$1" | wc -l) file(s); carry the other part next"
fi
