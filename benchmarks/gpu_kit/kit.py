#!/usr/bin/env python3
"""Bring a released vLLM to GPU machines that reach no package index (README.md).

Subcommands (prepare.sh runs the first two here, install.sh the last two there):

  deps WHEEL OUT_FILE      what vLLM needs that the GPU image lacks, resolved for
                           CPython 3.12 with the image's torch stack standing in
  pack STAGING OUT MIB     split STAGING's files into part folders of at most MIB
                           MiB each, with a manifest (kit.json) in every part
  install PART [SITE]      stage one part; once every part is staged, install
                           the whole kit into SITE (default /tmp/site)
  check [SITE]             report what the installed kit loads and lacks
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The GPU image's torch stack; the kit keeps it and never brings another.
IMAGE_TORCH = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0"}
#: Requirements resolved here but not brought: the image has certifi, and vLLM 0.33's
#: floor for it (2026.10.19) is newer than the index reachable from the CPU machines.
NOT_RESOLVED = {"certifi"}
CP312 = {
    "python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
    "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
    "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": "",
}
PLATFORMS = [
    "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any",
]
#: pip pointed at the package index alone (no local mirror or pip configuration).
PIP_ENV_DROP = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path: Path) -> set[str]:
    """Names in a list file: one a line, '#' starts a comment."""
    return {norm(line.split("#")[0].strip()) for line in path.read_text().splitlines()
            if line.split("#")[0].strip()}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_requirements(wheel: Path) -> list[str]:
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(CP312):
            continue
        if norm(req.name) in NOT_RESOLVED or norm(req.name) in IMAGE_TORCH:
            continue
        req.marker = None
        reqs.append(str(req))
    return reqs


def _stand_in_wheel(folder: Path, name: str, version: str) -> None:
    """A metadata-only wheel for ``name`` at the image's version (no dependencies)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: kit.py\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def deps(wheel: str, out_file: str) -> None:
    wheel_path = Path(wheel)
    image = listed(HERE / "image-packages.txt")
    leave_out = listed(HERE / "leave-out.txt")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        stand_ins = tmp_path / "stand-ins"
        stand_ins.mkdir()
        # "+image" local versions: only the stand-ins satisfy the constraints below.
        constraints = []
        for name, version in IMAGE_TORCH.items():
            _stand_in_wheel(stand_ins, name, f"{version}+image")
            constraints.append(f"{name}=={version}+image")
        (tmp_path / "constraints.txt").write_text("\n".join(constraints) + "\n")
        (tmp_path / "requirements.txt").write_text("\n".join(wheel_requirements(wheel_path)) + "\n")
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               *[a for p in PLATFORMS for a in ("--platform", p)],
               "--find-links", str(stand_ins), "--target", str(tmp_path / "target"),
               "--report", str(tmp_path / "report.json"),
               "-r", str(tmp_path / "requirements.txt"), "-c", str(tmp_path / "constraints.txt")]
        env = {k: v for k, v in os.environ.items() if k not in PIP_ENV_DROP}
        env["PIP_CONFIG_FILE"] = os.devnull
        subprocess.run(cmd, check=True, env=env)
        report = json.loads((tmp_path / "report.json").read_text())
    rows = sorted((norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in report["install"])
    bring = [(n, v) for n, v in rows if n not in image and n not in leave_out and n not in IMAGE_TORCH]
    in_image = [f"{n}=={v}" for n, v in rows if n in image and n not in IMAGE_TORCH]
    with open(out_file, "w") as f:
        f.write(f"# What {wheel_path.name} needs that the GPU image lacks, resolved for CPython 3.12\n"
                f"# with the image's torch stack standing in (kit.py deps). Brought as wheels.\n"
                f"# Resolved but left to the image: {', '.join(in_image)}\n"
                f"# Not brought (leave-out.txt): {', '.join(sorted(leave_out))}\n")
        for name, version in bring:
            f.write(f"{name}=={version}\n")
    print(f"{len(bring)} packages to bring, {len(in_image)} left to the image -> {out_file}")


#: Files every part folder holds beside its share of the kit.
HELPERS = ("install.sh", "kit.py")


def pack(staging: str, out: str, part_mib: str) -> None:
    """First-fit-decreasing into parts; a file over the part size is cut into pieces.

    A part folder, its helpers and manifest included, holds at most ``part_mib`` MiB.
    """
    src, dest = Path(staging), Path(out)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    # Room for install.sh, kit.py and kit.json (a manifest row is under 400 bytes).
    reserve = sum((HERE / h).stat().st_size for h in HELPERS) + 400 * (len(files) + 16) + 4096
    cap = int(float(part_mib) * (1 << 20)) - reserve
    items: list[tuple[int, Path, dict]] = []
    for path in files:
        size = path.stat().st_size
        rel = str(path.relative_to(src))
        if size <= cap:
            items.append((size, path, {"name": rel, "sha256": sha256(path), "size": size}))
            continue
        whole = sha256(path)
        count = -(-size // cap)
        with open(path, "rb") as f:
            for index in range(count):
                piece = path.with_name(f"{path.name}.piece{index:03d}")
                piece.write_bytes(f.read(cap))
                items.append((piece.stat().st_size, piece, {
                    "name": f"{rel}.piece{index:03d}", "sha256": sha256(piece),
                    "size": piece.stat().st_size, "whole": rel, "whole_sha256": whole,
                    "index": index, "count": count}))
        path.unlink()
    parts: list[list[tuple[int, Path, dict]]] = []
    for item in sorted(items, key=lambda i: -i[0]):
        for part in parts:
            if sum(i[0] for i in part) + item[0] <= cap:
                part.append(item)
                break
        else:
            parts.append([item])
    manifest = {"kit": dest.name, "parts": len(parts), "files": []}
    for number, part in enumerate(parts, 1):
        for _, _, entry in part:
            manifest["files"].append({**entry, "part": number})
    manifest["leave_out"] = sorted(listed(HERE / "leave-out.txt"))
    for number, part in enumerate(parts, 1):
        folder = dest / f"part-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        for _, path, entry in part:
            target = folder / entry["name"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), target)
        for helper in HELPERS:
            shutil.copy(HERE / helper, folder / helper)
        (folder / "kit.json").write_text(json.dumps(manifest, indent=1))
    for number in range(1, len(parts) + 1):
        folder = dest / f"part-{number}"
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder}: {size / (1 << 20):.1f} MiB ({size} bytes)")
        if size > float(part_mib) * (1 << 20):
            sys.exit(f"kit: {folder} is over {part_mib} MiB; lower the reserve's estimate")


def install(part: str, site: str = "/tmp/site") -> None:
    part_dir = Path(part).resolve()
    manifest = json.loads((part_dir / "kit.json").read_text())
    stage = Path(tempfile.gettempdir()) / f"kit-stage-{manifest['kit']}"
    stage.mkdir(parents=True, exist_ok=True)
    for entry in manifest["files"]:
        source = part_dir / entry["name"]
        if not source.exists():
            continue
        if sha256(source) != entry["sha256"]:
            sys.exit(f"kit: {source} is damaged (sha256 differs from kit.json); bring this part again")
        target = stage / entry["name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    missing = sorted({e["part"] for e in manifest["files"] if not (stage / e["name"]).exists()})
    if missing:
        print(f"kit {manifest['kit']}: staged {part_dir.name}; parts still to bring: "
              f"{', '.join(f'part-{m}' for m in missing)}")
        return
    for whole in sorted({e["whole"] for e in manifest["files"] if "whole" in e}):
        pieces = sorted((e for e in manifest["files"] if e.get("whole") == whole),
                        key=lambda e: e["index"])
        with open(stage / whole, "wb") as out:
            for piece in pieces:
                with open(stage / piece["name"], "rb") as f:
                    shutil.copyfileobj(f, out)
        if sha256(stage / whole) != pieces[0]["whole_sha256"]:
            sys.exit(f"kit: {whole} does not reassemble (sha256 differs); bring the parts again")
    site_dir = Path(site)
    site_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(str(p) for p in (stage / "wheels").glob("*.whl"))
    if wheels:
        # One pip call: packages sharing a namespace (opentelemetry, google) merge.
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site_dir),
                        *wheels], check=True)
    for archive in sorted(stage.glob("*.tar.xz")):
        with tarfile.open(archive) as tar:
            tar.extractall(site_dir, filter="fully_trusted")
    (site_dir / ".kit").write_text(json.dumps({"kit": manifest["kit"],
                                               "leave_out": manifest["leave_out"]}))
    print(f"kit {manifest['kit']}: installed into {site_dir}; export PYTHONPATH={site_dir}")
    check(site)


CHECK = r"""
import importlib, json, sys
from importlib import metadata
import torch
from packaging.requirements import Requirement
out = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
import vllm
out["vllm"] = vllm.__version__
out["vllm_from"] = vllm.__file__
def imports(names):
    result = {}
    for mod in names:
        try:
            importlib.import_module(mod)
            result[mod] = "ok"
        except BaseException as exc:
            result[mod] = f"{type(exc).__name__}: {exc}"[:300]
    return result
out["extensions"] = imports(("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch",
                             "vllm.vllm_flash_attn._vllm_fa3_C", "vllm._flashmla_C",
                             "vllm.cumem_allocator"))
# Pure-Python modules an engine start needs that earlier kits lacked or that import
# optional packages: vLLM's pynvml copy (platform detection), FlashInfer (MRV2's
# sampler imports vLLM's FlashInfer backend), the MRV2 runner and the CLI.
out["modules"] = imports(("vllm.third_party.pynvml", "flashinfer",
                          "vllm.v1.attention.backends.flashinfer",
                          "vllm.v1.worker.gpu.sample.sampler", "vllm.v1.worker.gpu.model_runner",
                          "vllm.v1.attention.backends.triton_attn", "vllm.entrypoints.cli.main"))
try:
    from vllm.platforms import current_platform
    out["platform"] = f"{type(current_platform).__name__} device_type={current_platform.device_type!r}"
except BaseException as exc:
    out["platform"] = f"{type(exc).__name__}: {exc}"[:300]
ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(("_C::", "_C_cache_ops::", "_moe_C::", "_vllm_fa3_C::"))]
out["ops_with_cuda_kernel"] = sum(torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA") for n in ops)
skip = set(json.loads(sys.argv[1]))
unmet = []
for line in metadata.requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    name = req.name.lower().replace("_", "-")
    if name in skip:
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        unmet.append(f"{req} (missing)")
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req} (have {have})")
out["requirements_unmet"] = unmet
print(json.dumps(out, indent=1))
"""


def check(site: str = "/tmp/site") -> None:
    site_dir = Path(site)
    info = json.loads((site_dir / ".kit").read_text()) if (site_dir / ".kit").exists() else {}
    skip = sorted(set(info.get("leave_out", [])) | set(IMAGE_TORCH) | NOT_RESOLVED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site_dir), *filter(None, [os.environ.get("PYTHONPATH")])])}
    subprocess.run([sys.executable, "-c", CHECK, json.dumps(skip)], env=env, check=False)


def main(argv: list[str]) -> None:
    commands = {"deps": deps, "pack": pack, "install": install, "check": check}
    if not argv or argv[0] not in commands:
        sys.exit(__doc__)
    commands[argv[0]](*argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
