#!/usr/bin/env bash
# Ray on a GPU machine without package access, for the serving soak's --ray runs.
# Ray's wheel is larger than one transfer, so it travels split in two folders, each
# carried by its own call (made beforehand, see benchmarks/README.md):
#   bash benchmarks/install_ray.sh .kit/ray/p1   # first part + Ray's missing dependencies
#   bash benchmarks/install_ray.sh .kit/ray/p2   # second part + checksum: assembles, installs
set -euo pipefail
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
