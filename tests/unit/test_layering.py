"""Which part of the repository may import which: the package neither the tests nor the
benchmark tooling, the tooling not the tests, and of the tests only a tool's own tests
(``tests/tools/test_*.py``) the tooling."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parents[2]
TESTS = ROOT / "tests"


def imported_modules(path: Path) -> list[str]:
    """The absolute module names ``path`` imports, those inside functions included."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def names_into_tests() -> set[str]:
    """Top-level names that resolve into tests/: ``tests``, and the modules and packages of
    each folder pytest puts on ``sys.path`` (tests/ and its folders without ``__init__.py``)."""
    names = {"tests"}
    for folder in [TESTS, *(p for p in TESTS.rglob("*") if p.is_dir())]:
        if (folder / "__init__.py").exists() or "__pycache__" in folder.parts:
            continue
        names |= {p.stem for p in folder.glob("*.py")}
        names |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    return names


def imports_of(folder: str, forbidden: set[str],
               exempt: Callable[[Path], bool] = lambda path: False) -> list[str]:
    """``FILE: imports MODULE`` for each import under ``folder`` of a top-level name in
    ``forbidden``, leaving out the files ``exempt`` accepts."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if exempt(path):
            continue
        found += [f"{path.relative_to(ROOT)}: imports {name}" for name in imported_modules(path)
                  if name.split(".")[0] in forbidden]
    return found


def is_a_tools_test(path: Path) -> bool:
    return path.parent == TESTS / "tools" and path.name.startswith("test_")


def test_the_package_imports_neither_the_tests_nor_the_benchmark_tooling():
    assert imports_of("src", names_into_tests() | {"benchmarks"}) == []


def test_the_benchmark_tooling_does_not_import_the_tests():
    assert imports_of("benchmarks", names_into_tests()) == []


def test_only_the_tools_own_tests_import_the_benchmark_tooling():
    assert imports_of("tests", {"benchmarks"}, exempt=is_a_tools_test) == []


def test_imports_inside_functions_and_of_test_helpers_are_seen(tmp_path):
    source = tmp_path / "tool.py"
    source.write_text("import os\nfrom . import sibling\n\n\ndef run():\n"
                      "    from e2e.bench_runs import run_batch_bench\n"
                      "    import benchmarks.tools.soak as soak\n")
    assert imported_modules(source) == ["os", "e2e.bench_runs", "benchmarks.tools.soak"]
    assert {"tests", "e2e", "conftest", "_serve_parser", "_refusal"} <= names_into_tests()


PACKAGE = ROOT / "src" / "vllm_pp_cudagraph"

#: The package's layers, lowest first: a module may import its own layer and those below,
#: except that each process's folder imports no other process's. The vLLM surface imports
#: no module of the package; no runtime module imports a command.
LAYERS = (
    ("vllm surface", ("shared.vllm_surface",)),
    ("shared", ("shared",)),
    ("process", ("engine_core", "worker", "api_server")),
    ("entry", ("patches", "plugin", "__init__")),
    ("commands", ("commands",)),
)


def package_imports(path: Path) -> list[str]:
    """The package's own modules ``path`` imports (``from X import module`` resolved)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("vllm_pp_cudagraph")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module.split(".")[0] == "vllm_pp_cudagraph"):
            found.append(node.module)
            base = PACKAGE.joinpath(*node.module.split(".")[1:])
            found += [f"{node.module}.{a.name}" for a in node.names
                      if (base / f"{a.name}.py").exists() or (base / a.name).is_dir()]
    return [name.removeprefix("vllm_pp_cudagraph").lstrip(".") or "__init__" for name in found]


def place(module: str) -> tuple[int, str]:
    """The layer of a module name relative to the package, and its folder."""
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return rank, prefix
    raise AssertionError(f"{module} is in no layer of LAYERS")


def upward_imports() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__") if module != "__init__" else module
        rank, folder = place(module)
        for imported in package_imports(path):
            if imported in ("shared", "commands"):  # the package folder itself
                continue
            their_rank, their_folder = place(imported)
            if their_rank > rank or (their_rank == rank == 2 and their_folder != folder) or (
                    rank == 0 and imported != module):
                problems.append(f"{module} ({LAYERS[rank][0]}) imports {imported} "
                                f"({LAYERS[their_rank][0]})")
    return problems


def test_no_module_imports_a_higher_layer_or_another_process():
    assert upward_imports() == []


def test_the_layer_check_sees_an_upward_import():
    """The check above reads real imports: a shared module importing the worker is caught."""
    shared = PACKAGE / "shared"
    planted = shared / "_planted_upward_import.py"
    planted.write_text("from vllm_pp_cudagraph.worker import model_runner\n")
    try:
        assert "shared._planted_upward_import (shared) imports worker.model_runner (process)" \
            in upward_imports()
    finally:
        planted.unlink()
