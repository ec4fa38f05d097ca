"""Whether torch, torchvision and vLLM import, and the command that repairs them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vllm_pp_cudagraph.shared import vllm_surface

#: ``pip install`` from the package index alone (no wheel folder, extra index or config).
INDEX_ONLY_PIP = "env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null pip install"

#: What is imported per package; for vLLM also its model-runner stack, which the plugin patches.
IMPORTS = {
    "torch": ("torch",),
    "torchvision": ("torchvision",),
    "vllm": ("vllm", vllm_surface.V2_RUNNER_MODULE),
}
#: The packages, in the order they depend on each other.
PACKAGES = tuple(IMPORTS)


@dataclass(frozen=True)
class ImportFailure:
    """An installed package that does not import, and how to reinstall it."""

    package: str
    version: str
    error: str
    fix: str

    def message(self) -> str:
        if self.package == "vllm":
            name, why = "vLLM", "Install vLLM again from the package index alone"
        else:
            name, why = self.package, (
                "torch and torchvision must be the builds vLLM pins (a '+cpu' torch from a "
                "local wheel folder or an extra index is the usual cause). Remove them and "
                "install vLLM again from the package index alone, which brings them back")
        return (f"{name} {self.version} is installed but does not import: {self.error}. "
                f"{why}:\n    {self.fix}")


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def fix_command(package: str) -> str:
    """The commands that replace ``package`` (torch with its torchvision) from the index:
    uninstall, then reinstall vLLM, which brings back the builds it pins."""
    broken = ["vllm"] if package == "vllm" else [
        name for name in ("torch", "torchvision") if vllm_surface.dist_version(name) is not None]
    # '0.30.0+cu130' -> '0.30.0': the same release, whichever build the index serves.
    vllm = (vllm_surface.dist_version("vllm") or "").split("+", 1)[0]
    return f'pip uninstall -y {" ".join(broken)} && {INDEX_ONLY_PIP} "vllm=={vllm}"'


def import_failure(packages: tuple[str, ...] = PACKAGES) -> ImportFailure | None:
    """The first installed package of ``packages`` that fails to import (those not
    installed are skipped)."""
    for package in packages:
        version = vllm_surface.dist_version(package)
        if version is None:
            continue
        try:
            for module in IMPORTS[package]:
                importlib.import_module(module)
        except Exception as exc:  # a broken build raises RuntimeError, OSError, ...
            return ImportFailure(package, version, describe(exc), fix_command(package))
    return None
