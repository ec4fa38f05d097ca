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


def test_no_runtime_module_imports_the_bench():
    """The bench is a user command beside the runtime: the modules vLLM's processes load
    never import it, and the CLI only hands ``vllm-pp-cudagraph bench`` over to it."""
    bench = ROOT / "src" / "vllm_pp_cudagraph" / "bench"
    found = [line for line in imports_of("src", {"vllm_pp_cudagraph"},
                                         exempt=lambda path: bench in path.parents)
             if line.split(": imports ")[1].startswith("vllm_pp_cudagraph.bench")]
    assert found == ["src/vllm_pp_cudagraph/cli/command.py: imports vllm_pp_cudagraph.bench"]
