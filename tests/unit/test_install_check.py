"""The command `check` prints to repair a torch, torchvision or vLLM that does not import."""

from __future__ import annotations

from importlib import metadata
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph import install_check

PREFIX = "env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null pip install"


@pytest.fixture
def installed(monkeypatch):
    """Pretend these distributions (name -> (version, requirements)) are installed."""
    def use(dists: dict[str, tuple[str, list[str]]]) -> None:
        def version(name):
            if name not in dists:
                raise metadata.PackageNotFoundError(name)
            return dists[name][0]

        def requires(name):
            if name not in dists:
                raise metadata.PackageNotFoundError(name)
            return dists[name][1]

        monkeypatch.setattr(install_check, "metadata", SimpleNamespace(
            version=version, requires=requires, PackageNotFoundError=metadata.PackageNotFoundError))

    return use


def test_torch_is_reinstalled_at_the_release_vllm_pins_not_the_one_installed(installed):
    # pip's configuration supplied another torch release's +cpu build
    installed({"vllm": ("0.26.0", ["torch==2.11.0", "torchvision==0.26.0", "numpy"]),
               "torch": ("2.13.0+cpu", []), "torchvision": ("0.26.0", [])})
    assert install_check.fix_command("torchvision") == (
        f'{PREFIX} --force-reinstall "torch==2.11.0" "torchvision==0.26.0"')


def test_without_a_pin_the_installed_release_is_kept_without_its_build(installed):
    installed({"vllm": ("0.30.0", ["torch>=2.13", 'torchvision==9.9; extra == "video"']),
               "torch": ("2.13.0+cpu", []), "torchvision": ("0.28.0+cpu", [])})
    assert install_check.fix_command("torch") == (
        f'{PREFIX} --force-reinstall "torch==2.13.0" "torchvision==0.28.0"')


def test_a_vllm_that_does_not_import_is_reinstalled_at_its_release(installed):
    installed({"vllm": ("0.26.0+cu130", []), "torch": ("2.11.0", [])})
    assert install_check.fix_command("vllm") == f'{PREFIX} --force-reinstall "vllm==0.26.0"'
    assert install_check.fix_command("torch") == f'{PREFIX} --force-reinstall "torch==2.11.0"'


def test_the_message_names_the_package_its_error_and_the_fix():
    failure = install_check.ImportFailure("torchvision", "0.26.0", "RuntimeError: boom", "CMD")
    text = failure.message()
    assert text.startswith("torchvision 0.26.0 is installed but does not import: RuntimeError: boom.")
    assert "matching builds" in text and text.endswith("\n    CMD")
    assert install_check.describe(RuntimeError("first\nsecond")) == "RuntimeError: first"
