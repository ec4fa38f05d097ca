#!/usr/bin/env bash
# Packs a released vLLM for the GPU hosts (Python 3.12, torch 2.11.0+cu130, no
# package index) into part folders of at most PART_MIB MiB each, one transfer each.
# See README.md for why this can work for vLLM 0.29+ and what is untested.
#
# usage: benchmarks/gpu_kit/prepare.sh VERSION OUT     e.g. 0.33.0 .kit/k33
# env:   PART_MIB    the most one part folder holds, helpers and manifest included
#                    (default 40: a transfer holds 64 MiB with the project's own files,
#                    about 17 MB in November 2026 and growing with its results)
#        VLLM_WHEEL  a vllm-VERSION wheel already downloaded (else it is downloaded)
#
# OUT/part-N/ each hold some of: vLLM's compiled extensions (vllm-native.tar.xz, cut
# into pieces when larger than a part), its Python sources (vllm-py.tar.xz), FlashInfer
# at vLLM's pin (flashinfer.tar.xz) and the dependency wheels the image lacks (deps-VERSION.txt beside this script, resolved
# by `kit.py deps` when missing), plus install.sh, kit.py and the manifest kit.json.
set -euo pipefail
ver=${1:?usage: prepare.sh VERSION OUT}
out=${2:?usage: prepare.sh VERSION OUT}
part_mib=${PART_MIB:-40}
here=$(cd "$(dirname "$0")" && pwd)
[ -e "$out" ] && { echo "prepare.sh: $out exists; remove it or pick another" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The CUDA builds of vLLM and its pins come from the package index alone.
pip_index() { env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null "$@"; }

if [ -n "${VLLM_WHEEL:-}" ]; then   # a wheel downloaded before: skips the 330 MB download
  mkdir -p "$work/dl" && cp "$VLLM_WHEEL" "$work/dl/"
else
  echo "downloading vllm==$ver"
  pip_index python3 -m pip download -q --no-deps "vllm==$ver" -d "$work/dl"
fi
whl=$(ls "$work"/dl/vllm-"$ver"-*.whl)
deps="$here/deps-$ver.txt"
if [ ! -f "$deps" ]; then
  echo "resolving what vLLM $ver needs beyond the GPU image (deps-$ver.txt)"
  pip_index python3 "$here/kit.py" deps "$whl" "$deps"
fi

# Left behind: FlashAttention 2 (pre-Hopper GPUs, 294 MB), DeepGEMM (JIT headers),
# QuTLASS (FP4; on 0.33 it needs symbols torch 2.11 lacks) and the vllm-rs binary.
# The Triton attention backend uses none of them. The rest of vllm/third_party stays:
# vLLM finds its CUDA platform through the pynvml copy there.
mkdir -p "$work/x" "$work/staging/wheels"
(cd "$work/x" && unzip -q "$whl" -x 'vllm/vllm_flash_attn/_vllm_fa2_C*.so' \
  'vllm/third_party/deep_gemm/*' 'vllm/_qutlass_C*.so' 'vllm/vllm-rs')
echo "packing the compiled extensions"
(cd "$work/x" && find vllm -name '*.so' -print0 | sort -z | xargs -0 tar cf - \
  | xz -9 -T2 > "$work/staging/vllm-native.tar.xz")
echo "packing the Python sources"
(cd "$work/x" && find vllm -name '*.so' -delete && tar cf - vllm vllm-*.dist-info \
  | xz -9 -T2 > "$work/staging/vllm-py.tar.xz")
echo "downloading the dependency wheels (CPython 3.12, manylinux)"
plats=()
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
  manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
  manylinux1_x86_64 any; do plats+=(--platform "$p"); done
grep -v '^#' "$deps" > "$work/deps.txt"
pip_index python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plats[@]}" -d "$work/staging/wheels" -r "$work/deps.txt"
# MRV2's sampler imports FlashInfer unguarded (0.33: flashinfer_sampler_supported imports
# vLLM's FlashInfer backend unless VLLM_USE_FLASHINFER_SAMPLER=0), so it comes at the
# wheel's own pin. Its wheel is pure Python and 62 MB (CUDA sources for its JIT); unpacked
# into flashinfer.tar.xz (dist-info included) it is 17 MB. Its own requirements beyond
# the image (cuda-tile, nccl4py, cuDNN frontend, CuTe DSL) stay out: leave-out.txt.
fi_pin=$(unzip -p "$whl" 'vllm-*.dist-info/METADATA' \
  | sed -n 's/^Requires-Dist: \(flashinfer-python==[^ ;]*\)$/\1/p' | head -1)
if [ -n "$fi_pin" ]; then
  echo "bringing $fi_pin (unpacked, as flashinfer.tar.xz)"
  pip_index python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plats[@]}" -d "$work/fi" "$fi_pin"
  mkdir -p "$work/fi/x"
  (cd "$work/fi/x" && unzip -q "$work"/fi/flashinfer_python-*.whl \
    && tar cf - * | xz -9 -T2 > "$work/staging/flashinfer.tar.xz")
else
  echo "vllm $ver pins no flashinfer-python: none brought"
fi

python3 "$here/kit.py" pack "$work/staging" "$out" "$part_mib"
echo "bring each $out/part-N over on its own and run its install.sh there (README.md)"
