"""The vLLM surface the plugin relies on, and the per-release differences compat absorbs."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.shared import vllm_surface

PACKAGE = Path(vllm_surface.__file__).parent


def vllm_imports(source: str) -> list[tuple[int, str, str]]:
    """(line, module, name) of every vLLM name a module's source imports.

    ``import vllm.x.y`` gives the module itself as (``vllm.x``, ``y``).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, *alias.name.rpartition(".")[::2]) for alias in node.names
                      if alias.name.split(".")[0] == "vllm"]
    return found


def listed(module: str, name: str) -> bool:
    """Whether SURFACE names ``module.name``, as a name in a module or as a module."""
    return any((need.module, need.name) == (module, name) or need.module == f"{module}.{name}"
               for need in vllm_surface.SURFACE)


def test_every_vllm_name_the_package_imports_is_in_the_surface():
    unlisted = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}.{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module, name in vllm_imports(path.read_text())
        if not listed(module, name)
    ]
    assert unlisted == [], (
        "imported from vLLM but missing from vllm_surface.SURFACE (add a Needed entry, so a vLLM "
        "upgrade that drops it fails the surface test): " + "; ".join(unlisted)
    )


def test_the_import_walk_sees_every_form_of_vllm_import():
    source = (
        "import os\nfrom vllm.a import B, C\nimport vllm.x.y\n"
        "def f():\n    from vllm import LLM\n"
        "if TYPE_CHECKING:\n    from vllm.t import T\nfrom vllmx import Z\n"
    )
    assert sorted(vllm_imports(source)) == [(2, "vllm.a", "B"), (2, "vllm.a", "C"), (3, "vllm.x", "y"),
                                     (5, "vllm", "LLM"), (7, "vllm.t", "T")]
    assert listed("vllm.logger", "init_logger")
    assert listed("vllm.compilation", "breakable_cudagraph")
    assert not listed("vllm.logger", "no_such_name")


def test_installed_vllm_has_every_name_the_plugin_relies_on():
    missing = vllm_surface.missing_surface()
    assert missing == [], (
        f"vLLM {vllm_surface.installed_versions().vllm} lacks what the plugin relies on: "
        + "; ".join(missing)
        + ". Adapt vllm_surface.py (and the code using these names) before supporting it."
    )


def test_a_missing_name_is_reported_by_its_full_path():
    surface = (
        vllm_surface.Needed("vllm.v1.worker.gpu.cudagraph_utils", "ModelCudaGraphManager",
                      members=("capture", "no_such_method"),
                      instance_attrs=("_capture_descs", "_no_such_attr")),
        vllm_surface.Needed("vllm.v1.worker.gpu.cudagraph_utils", "NoSuchClass"),
        vllm_surface.Needed("vllm.no_such_module", "X"),
    )
    missing = vllm_surface.missing_surface(surface)
    assert missing[0] == "vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager.no_such_method"
    assert missing[1].endswith("ModelCudaGraphManager: instance attribute _no_such_attr")
    assert missing[2] == "vllm.v1.worker.gpu.cudagraph_utils.NoSuchClass"
    assert missing[3].startswith("vllm.no_such_module: cannot import")
    assert len(missing) == 4


def test_names_only_a_standing_aside_patch_reads_are_checked_only_where_it_applies(monkeypatch):
    surface = (vllm_surface.Needed("vllm.v1.request", "Request", instance_attrs=("_gone_attr",),
                                   used_where="worker_runner_factory"),)
    monkeypatch.setattr(vllm_surface, "worker_runner_factory", lambda: None)
    assert vllm_surface.missing_surface(surface) == []
    monkeypatch.setattr(vllm_surface, "worker_runner_factory", lambda: ("Worker", "x"))
    assert vllm_surface.missing_surface(surface) == ["vllm.v1.request.Request: instance attribute _gone_attr"]


def test_every_conditional_surface_entry_names_a_probe():
    for need in vllm_surface.SURFACE:
        if need.used_where is not None:
            assert callable(getattr(vllm_surface, need.used_where, None)), need


def test_draft_tokens_are_passed_only_where_the_handler_takes_them():
    class Handler029:
        def get_prev_sampled_outputs(self):
            return {"sampled": "tokens"}

    class Handler030:
        def get_prev_sampled_outputs(self, draft_tokens_to_update=None):
            return {"sampled": "tokens", "drafts": draft_tokens_to_update}

    # The step uses what the handler returns, drafts updated where the handler takes them.
    assert vllm_surface.prev_sampled_outputs(Handler029(), "drafts") == {"sampled": "tokens"}
    assert vllm_surface.prev_sampled_outputs(Handler030(), "drafts") == {"sampled": "tokens",
                                                                   "drafts": "drafts"}
    assert vllm_surface.prev_sampled_outputs(Handler030()) == {"sampled": "tokens", "drafts": None}


def test_admission_reads_the_queues_and_cap_of_each_scheduler_shape():
    up_to_030 = SimpleNamespace(waiting=[], skipped_waiting=["r"], max_num_running_reqs=8)
    from_031 = SimpleNamespace(waiting=[], kv_holding_waiting=["r"], max_num_running_reqs=8,
                               max_num_active_reqs=6)
    assert any(vllm_surface.waiting_queues(up_to_030)) and vllm_surface.admission_cap(up_to_030) == 8
    assert any(vllm_surface.waiting_queues(from_031)) and vllm_surface.admission_cap(from_031) == 6
    assert not any(vllm_surface.waiting_queues(SimpleNamespace(waiting=[], kv_holding_waiting=[])))


def test_installed_scheduler_has_a_waiting_queue_compat_knows(tmp_path):
    from _scheduler import make_scheduler

    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    scheduler = make_scheduler(str(write_model_dir(tmp_path, tokenizer=False)))
    assert "waiting" in [n for n in vllm_surface.WAITING_QUEUE_NAMES if hasattr(scheduler, n)]
    assert len(vllm_surface.waiting_queues(scheduler)) == 2
    assert vllm_surface.admission_cap(scheduler) == 8


def test_vllms_runner_builds_its_manager_by_the_name_the_plugin_points_elsewhere():
    """The graph-manager patch points ``ModelCudaGraphManager`` of the runner's module at
    the plugin's class while ``initialize_kv_cache`` runs; that method must build its
    manager by that name, and the name must be vLLM's again afterwards, error or not."""
    import inspect

    import vllm.v1.worker.gpu.model_runner as mr
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    from vllm_pp_cudagraph.worker.graphs.cudagraph_manager import PPCudaGraphManager

    source = inspect.getsource(inspect.unwrap(mr.GPUModelRunner).initialize_kv_cache)
    assert "ModelCudaGraphManager(" in source
    with vllm_surface.managers_built_as(PPCudaGraphManager):
        assert mr.ModelCudaGraphManager is PPCudaGraphManager
    assert mr.ModelCudaGraphManager is ModelCudaGraphManager
    with pytest.raises(KeyError), vllm_surface.managers_built_as(PPCudaGraphManager):
        raise KeyError
    assert mr.ModelCudaGraphManager is ModelCudaGraphManager


@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_probes_agree_with_the_installed_release(switch, monkeypatch):
    from vllm.compilation.breakable_cudagraph import is_breakable_cudagraph_enabled

    release = vllm_surface.parse_release(vllm_surface.installed_versions().vllm)
    # The breakable probe is cached per process, so it must not depend on the switch.
    if switch is None:
        monkeypatch.delenv("VLLM_USE_BREAKABLE_CUDAGRAPH", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", switch)
    vllm_surface.breakable_decided_at_import.cache_clear()
    try:
        assert vllm_surface.breakable_decided_at_import() == (release < (0, 33, 0))
        assert is_breakable_cudagraph_enabled() == (switch == "1")
    finally:
        vllm_surface.breakable_decided_at_import.cache_clear()


def test_supported_range_matches_the_package_requirement():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert f"vllm{vllm_surface.SUPPORTED_RANGE}" in pyproject["project"]["dependencies"]


def test_every_vllm_method_a_patch_wraps_is_in_the_surface():
    """A patch reaches vLLM through importlib and attribute names, not imports: each
    ``module.Class.method`` its target names must be a SURFACE member, so an upgrade that
    drops or renames it fails the surface test instead of the patch at start-up."""
    import re

    from vllm_pp_cudagraph.patches import PATCHES

    found = [m.groups() for patch in PATCHES
             for m in re.finditer(r"\b(vllm(?:\.\w+)+)\.([A-Z]\w*)\.(\w+)\b", patch.target)]
    assert len(found) >= 5, found  # the regex reads the targets as they are written
    unlisted = [f"{module}.{cls}.{member}" for module, cls, member in found
                if not any((need.module, need.name) == (module, cls) and member in need.members
                           for need in vllm_surface.SURFACE)]
    assert unlisted == []


def test_sampling_warm_ups_are_registered_in_the_runners_registry(monkeypatch):
    """vLLM's registration runs with the runner's registry active, so what it registers
    lands there and vLLM's kernel warm-up compiles it; where the release has no such
    registration, nothing is registered."""
    import importlib

    module_name, name = vllm_surface.SAMPLING_WARM_UPS
    module = importlib.import_module(module_name)
    kernel = object()
    if hasattr(module, name):
        from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

        # vLLM's kernels register themselves only with Triton on a GPU: one stands in.
        monkeypatch.setattr(module, name, lambda: JitWarmupRegistry.register(kernel))
        registry = JitWarmupRegistry(None)
        assert vllm_surface.register_sampling_warm_ups(registry)
        assert len(registry) == 1
        assert not vllm_surface.register_sampling_warm_ups(None)  # a runner without a registry
    else:
        registry = SimpleNamespace(activate=lambda: pytest.fail("nothing to register"))
        assert not vllm_surface.register_sampling_warm_ups(registry)
