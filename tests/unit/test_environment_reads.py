"""The environment is read and written in one module, ``shared/settings.py``: a setting's reach
(every process vLLM starts) and its reading are then decided in one place."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from vllm_pp_cudagraph.shared import settings

PACKAGE = Path(settings.__file__).parents[1]
#: The commands (``bench`` starts servers and engines, ``check`` reports the environment)
#: build and read environments as a user's command; they are no part of the runtime.
EXEMPT = {PACKAGE / "shared/settings.py", PACKAGE / "commands"}


def environment_uses(path: Path, root: Path = PACKAGE) -> list[str]:
    """``FILE:LINE os.NAME`` for each use of the process environment in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "os" and node.attr in {"environ", "getenv", "putenv",
                                                            "unsetenv", "environb"}):
            found.append(f"{path.relative_to(root)}:{node.lineno} os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = {alias.name for alias in node.names} & {"environ", "getenv", "putenv"}
            found += [f"{path.relative_to(root)}:{node.lineno} from os import {n}"
                      for n in sorted(names)]
    return found


def test_no_runtime_module_but_settings_touches_the_environment():
    uses = [use for path in sorted(PACKAGE.rglob("*.py"))
            if not any(path == e or e in path.parents for e in EXEMPT)
            for use in environment_uses(path)]
    assert uses == []


def test_the_scan_sees_each_way_of_reaching_the_environment(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("import os\nfrom os import getenv\nx = os.environ.get('A')\n"
                      "os.environ['B'] = '1'\ny = os.getenv('C')\n")
    assert sorted(u.split(" ", 1)[1] for u in environment_uses(module, tmp_path)) == [
        "from os import getenv", "os.environ", "os.environ", "os.getenv"]


def test_a_variable_the_plugin_does_not_declare_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(KeyError, match="VLLM_VARIABLES"):
        settings.environment_value("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("VLLM_PLUGINS", "pp_cudagraph")
    assert settings.environment_value("VLLM_PLUGINS") == "pp_cudagraph"
    assert settings.environment_value("VLLM_PLUGINS", {"VLLM_PLUGINS": "x"}) == "x"


@pytest.mark.parametrize("before", [None, "earlier"])
def test_a_variable_set_for_vllm_is_restored_by_its_undo(monkeypatch, before):
    name = "VLLM_USE_BREAKABLE_CUDAGRAPH"
    if before is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, before)
    undo = settings.set_variable(name, "1")
    assert os.environ[name] == "1"
    undo()
    assert os.environ.get(name) == before
