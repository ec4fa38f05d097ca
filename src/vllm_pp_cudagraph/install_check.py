"""Whether torch, torchvision and vLLM import, and the command that repairs them.

An install can hold every package and still not import: pip's configuration
(a local wheel folder, an extra index) may pick a ``+cpu`` torch whose
torchvision was built for another torch, and vLLM's import then fails deep
inside torchvision (``operator torchvision::nms does not exist``).
:func:`import_failure` imports the packages one by one, in the order they
depend on each other, so the first that fails names the cause.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vllm_pp_cudagraph import compat

#: ``pip install`` from the package index alone: no local wheel folder, extra
#: index or configuration file that could pick another torch build.
INDEX_ONLY_PIP = "env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null pip install"

#: What is imported per package; for vLLM also the module the plugin patches
#: first, which pulls in its model-runner stack (transformers, torchvision).
IMPORTS = {
    "torch": ("torch",),
    "torchvision": ("torchvision",),
    "vllm": ("vllm", compat.V2_RUNNER_MODULE),
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
        name = "vLLM" if self.package == "vllm" else self.package
        if self.package == "vllm":
            why = "Install vLLM again from the package index alone"
        else:
            why = (
                "torch and torchvision must be the builds vLLM pins (a '+cpu' torch from a "
                "local wheel folder or an extra index is the usual cause). Remove them and "
                "install vLLM again from the package index alone, which brings them back"
            )
        return (f"{name} {self.version} is installed but does not import: {self.error}. "
                f"{why}:\n    {self.fix}")


def _release(version: str) -> str:
    """``'2.13.0+cpu'`` -> ``'2.13.0'``: the same release, whichever build the index serves."""
    return version.split("+", 1)[0]


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


def fix_command(package: str) -> str:
    """The commands that replace ``package`` (torch with its torchvision) from the index.

    The broken packages are removed and vLLM is installed again from the
    package index alone, so pip brings back the torch and torchvision builds
    vLLM pins and leaves everything else as it is (``--force-reinstall`` would
    also upgrade their dependencies past what vLLM's own tree allows).
    """
    broken = ["vllm"] if package == "vllm" else [
        name for name in ("torch", "torchvision") if compat.dist_version(name) is not None]
    vllm = _release(compat.dist_version("vllm") or "")
    return f'pip uninstall -y {" ".join(broken)} && {INDEX_ONLY_PIP} "vllm=={vllm}"'


def import_failure(packages: tuple[str, ...] = PACKAGES) -> ImportFailure | None:
    """The first installed package of ``packages`` that fails to import.

    Packages that are not installed are skipped: whether vLLM is installed is
    reported on its own, and torchvision is only needed where vLLM pulls it in.
    """
    for package in packages:
        version = compat.dist_version(package)
        if version is None:
            continue
        try:
            for module in IMPORTS[package]:
                importlib.import_module(module)
        except Exception as exc:  # a broken build raises RuntimeError, OSError, ...
            return ImportFailure(package, version, describe(exc), fix_command(package))
    return None
