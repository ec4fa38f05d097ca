"""The command `check` prints to repair a torch, torchvision or vLLM that does not import."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.commands.cli import install_check

INDEX_ONLY = "env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null pip install"


@pytest.fixture
def installed(monkeypatch):
    """Pretend exactly these distributions (name -> version) are installed."""
    def use(versions: dict[str, str]) -> None:
        def version(name):
            if name not in versions:
                raise metadata.PackageNotFoundError(name)
            return versions[name]

        monkeypatch.setattr(vllm_surface, "metadata", SimpleNamespace(
            version=version, PackageNotFoundError=metadata.PackageNotFoundError))

    return use


def test_a_broken_torch_is_removed_and_vllm_brings_back_the_builds_it_pins(installed):
    # pip's configuration supplied a +cpu torch of another release
    installed({"vllm": "0.26.0", "torch": "2.13.0+cpu", "torchvision": "0.26.0"})
    expected = f'pip uninstall -y torch torchvision && {INDEX_ONLY} "vllm==0.26.0"'
    assert install_check.fix_command("torchvision") == expected
    assert install_check.fix_command("torch") == expected


def test_only_installed_packages_are_removed(installed):
    installed({"vllm": "0.30.0+cu130", "torch": "2.13.0+cpu"})
    assert install_check.fix_command("torch") == (
        f'pip uninstall -y torch && {INDEX_ONLY} "vllm==0.30.0"')


def test_a_vllm_that_does_not_import_is_installed_again_at_its_release(installed):
    installed({"vllm": "0.26.0", "torch": "2.11.0"})
    assert install_check.fix_command("vllm") == (
        f'pip uninstall -y vllm && {INDEX_ONLY} "vllm==0.26.0"')


def test_the_message_names_the_package_its_error_and_the_fix():
    failure = install_check.ImportFailure("torchvision", "0.26.0", "RuntimeError: boom", "CMD")
    text = failure.message()
    assert text.startswith("torchvision 0.26.0 is installed but does not import: RuntimeError: boom.")
    assert "the builds vLLM pins" in text and text.endswith("\n    CMD")
    assert install_check.describe(RuntimeError("first\nsecond")) == "RuntimeError: first"
    assert install_check.describe(OSError()) == "OSError"
