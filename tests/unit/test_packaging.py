"""What the sdist and the wheel carry: the README's links and the tests, not the dated
results, and the product alone in the wheel."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vllm_pp_cudagraph

ROOT = Path(__file__).parents[2]
PACKAGE = Path(vllm_pp_cudagraph.__file__).parent
#: The dated GPU and CPU runs: kept in the repository, left out of the sdist.
RESULTS = "benchmarks/results"


def manifest_covers(path: str) -> bool:
    """Whether MANIFEST.in's ``graft``/``include`` lines, less what a later ``prune`` takes
    out, or the package itself, ship ``path``."""
    if path.startswith("src/"):
        return True
    covered = False
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        command, _, target = line.partition(" ")
        target = target.strip().rstrip("/")
        under = path == target or path.startswith(target + "/")
        if command == "graft" and under:
            covered = True
        elif command == "prune" and under:
            covered = False
        elif command == "include" and path in target.split():
            covered = True
    return covered


def sdist_files() -> list[str]:
    """The tree's files MANIFEST.in puts into the sdist, found the cheap way (no build):
    every file under a ``graft`` that ``manifest_covers``, less compiled Python."""
    grafts = [line.split(None, 1)[1].strip().rstrip("/")
              for line in (ROOT / "MANIFEST.in").read_text().splitlines()
              if line.startswith("graft ")]
    files = set()
    for graft in grafts:
        for path in (ROOT / graft).rglob("*"):
            relative = path.relative_to(ROOT).as_posix()
            if (path.is_file() and "__pycache__" not in path.parts
                    and path.suffix not in (".pyc", ".pyo", ".pyd") and manifest_covers(relative)):
                files.add(relative)
    return sorted(files)


def test_every_relative_link_of_the_readme_exists_and_ships_in_the_sdist():
    """Links into the dated results are the exception: they work from a clone, and the
    sdist leaves them out."""
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    relative = [link.rstrip("/") for link in links if "://" not in link]
    assert relative, "the README links nothing relative; this test reads it wrongly"
    archive = [link for link in relative if (link + "/").startswith(RESULTS + "/")]
    shipped = [link for link in relative if link not in archive]
    assert [link for link in shipped if not (ROOT / link).exists()] == []
    assert [link for link in shipped if not manifest_covers(link)] == []
    if (ROOT / RESULTS).is_dir():  # a clone
        assert [link for link in archive if not (ROOT / link).exists()] == []


def test_the_sdist_leaves_the_dated_results_out_and_keeps_the_tooling_and_tests():
    files = sdist_files()
    assert manifest_covers(RESULTS + "/INDEX.md") is False
    assert [f for f in files if f.startswith(RESULTS + "/")] == []
    assert {"benchmarks/README.md", "benchmarks/gpu_kit/README.md", "benchmarks/tools/soak.py",
            "tests/data/stage_costs_vllm033.json"} <= set(files)
    test_files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    assert [f for f in test_files if f not in files] == []


def test_no_test_reads_the_dated_results():
    """The sdist leaves ``benchmarks/results`` out, so a test that opened a file there
    would fail from an unpacked sdist; data a test needs lives in ``tests/data``."""
    reading = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path == Path(__file__):
            continue
        strings = {node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        if {"benchmarks", "results"} <= strings or any(s.startswith(RESULTS) for s in strings):
            reading.append(path.relative_to(ROOT).as_posix())
    assert reading == []


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


def test_the_version_is_the_changelogs_newest():
    """The version the package reports is the one the changelog's newest section names."""
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\d+\.\d+\.\d+)", changelog, re.M).group(1)
    assert vllm_pp_cudagraph.__version__.startswith(newest)


def test_every_data_file_of_the_package_is_in_the_wheel():
    """A data file the package reads (the proven tables, cost tables, plan's cells) left out
    of ``package-data`` is missing from an installed wheel, and the plugin fails to import."""
    import fnmatch
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["vllm_pp_cudagraph"]
    data = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc", ".typed", ".md")
            and "__pycache__" not in path.parts]
    assert data, "no data files found: is PACKAGE the source tree?"
    missing = [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert missing == []
