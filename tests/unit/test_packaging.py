"""What the sdist and the wheel carry: the README's links, and the product alone in the wheel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vllm_pp_cudagraph

ROOT = Path(__file__).parents[2]
PACKAGE = Path(vllm_pp_cudagraph.__file__).parent


def manifest_covers(path: str) -> bool:
    """Whether MANIFEST.in's ``graft``/``include`` lines, or the package itself, ship ``path``."""
    if path.startswith("src/"):
        return True
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        command, _, target = line.partition(" ")
        target = target.strip().rstrip("/")
        if command == "graft" and (path == target or path.startswith(target + "/")):
            return True
        if command == "include" and path in target.split():
            return True
    return False


def test_every_relative_link_of_the_readme_exists_and_ships_in_the_sdist():
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links nothing relative; this test reads it wrongly"
    assert [link for link in relative if not (ROOT / link).exists()] == []
    assert [link for link in relative if not manifest_covers(link.rstrip("/"))] == []


def test_nothing_in_the_package_reaches_into_the_repositorys_tests_or_tooling():
    """The wheel holds src/ alone: an import of benchmarks.* or tests.* would fail
    for every user, and a pointer into tests/ names a file they do not have."""
    reaching = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            reaching += [f"{path.name}: imports {n}" for n in names
                         if n.split(".")[0] in ("benchmarks", "tests")]
        reaching += [f"{path.name}: names tests/" for line in source.splitlines()
                     if "tests/" in line]
    assert reaching == []
