"""`vllm-pp-cudagraph check`: output and the exit codes the README states."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared import settings
from vllm_pp_cudagraph.commands.cli import command as cli
from vllm_pp_cudagraph.commands.cli import install_check
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts
from vllm_pp_cudagraph.commands.planning.shapes import read_model_config
from vllm_pp_cudagraph.shared.settings import PPCudaGraphSettings

#: A GPU as torch describes it, for the commands that read the visible ones.
GPU = SimpleNamespace(name="NVIDIA H200", total_memory=141 * 2**30)


@pytest.fixture
def gpus(clean_env):
    """Two GPUs visible, unless a test says otherwise."""
    clean_env.setattr(cli, "_visible_gpus", lambda: [GPU] * 2)
    return clean_env


def run_check(full: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.check(out, full=full)
    return code, out.getvalue()


def test_supported_install_enabled(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert f"vLLM: {vllm_surface.installed_versions().vllm}" in out and "OK" in out
    assert "plugin ENABLED" in out
    assert "filters every other vLLM plugin" in out
    assert "imports: torch, torchvision OK" in out
    assert cli.FULL_ONLY in out
    assert "GPUs visible: 2" in out


def test_full_check_lists_the_patches(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    code, out = run_check(full=True)
    assert code == cli.EXIT_OK
    assert "imports: torch, torchvision, vLLM OK" in out
    assert cli.FULL_ONLY not in out
    assert ("runner-factory (worker): applies  "
            "[vllm.v1.worker.gpu_worker.Worker._make_model_runner") in out
    assert ("breakable-env (every process): stands aside: "
            "VLLM_PP_CUDAGRAPH_BREAKABLE is off") in out
    assert "scheduler-class (API server): applies" in out
    assert "engine-core-check (engine core): applies" in out
    assert "GPUs visible: 2" in out


def test_no_gpu_visible_is_a_problem(gpus):
    gpus.setattr(cli, "_visible_gpus", lambda: [GPU] * 0)
    code, out = run_check()
    assert code == cli.EXIT_NO_GPU
    assert "no NVIDIA GPU visible" in out


def test_unset_plugins_says_how_to_enable(gpus):
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "INACTIVE" in out and "Set VLLM_PLUGINS=pp_cudagraph" in out


def test_misspelt_plugin_name_exits_nonzero(gpus):
    gpus.setenv("VLLM_PLUGINS", "lora_filesystem_resolver, pp-cudagraph")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "INACTIVE" in out
    assert "' pp-cudagraph' is not the plugin's name; did you mean 'pp_cudagraph'" in out


def test_other_plugin_named_alone_is_not_a_misspelling(gpus):
    gpus.setenv("VLLM_PLUGINS", "lora_filesystem_resolver")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "INACTIVE" in out


def test_unsupported_vllm_exits_nonzero(gpus):
    gpus.setattr(vllm_surface, "installed_versions", lambda: vllm_surface.VersionInfo("0.25.1", "2.10.0"))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "0.25.1" in out and "UNSUPPORTED" in out


def test_unsupported_vllm_with_the_override_is_allowed(gpus):
    gpus.setattr(vllm_surface, "installed_versions", lambda: vllm_surface.VersionInfo("0.40.0", "2.14.0"))
    gpus.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "1")
    code, out = run_check()
    assert code == cli.EXIT_OK
    assert "allowed by VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1" in out
    assert "or set VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 to try anyway" not in out


def test_missing_vllm_exits_nonzero(gpus):
    gpus.setattr(vllm_surface, "installed_versions", lambda: vllm_surface.VersionInfo(None, None))
    code, out = run_check()
    assert code == cli.EXIT_UNSUPPORTED
    assert "not installed" in out


def test_invalid_setting_exits_nonzero(gpus):
    gpus.setenv("VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM", "perhaps")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM='perhaps'" in out


def test_v1_runner_with_plugin_enabled_exits_nonzero(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    gpus.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    assert "VLLM_USE_V2_MODEL_RUNNER='0' selects the V1 runner" in out


def test_console_script_runs_and_reports_the_missing_gpu(clean_env):
    # pip puts console scripts beside the interpreter that installed the package
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    exe = shutil.which("vllm-pp-cudagraph", path=search)
    assert exe is not None
    proc = subprocess.run([exe, "check"], capture_output=True, text=True, timeout=300)
    import torch

    assert proc.returncode == (cli.EXIT_OK if torch.cuda.is_available() else cli.EXIT_NO_GPU)
    assert "vllm-pp-cudagraph" in proc.stdout and "GPUs visible" in proc.stdout


def test_a_vllm_whose_internals_moved_is_reported_not_raised(gpus, monkeypatch):
    from vllm_pp_cudagraph import patches

    def standing(settings):
        raise AttributeError("type object 'AsyncScheduler' has no attribute 'schedule'")

    monkeypatch.setattr(patches, "standing", standing)
    code, out = run_check(full=True)
    assert code == cli.EXIT_BROKEN_INSTALL
    assert ("patches: could not be listed: AttributeError: type object 'AsyncScheduler' "
            "has no attribute 'schedule'") in out
    assert "GPUs visible: 2" in out  # the report goes on to the end


# A package that is installed but fails as it loads, as a '+cpu' torch beside a
# torchvision built for another torch does; installed before the CLI is imported.
BROKEN_IMPORT = """
import importlib.abc, sys

class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise {error}
        return None

sys.meta_path.insert(0, Broken())
from vllm_pp_cudagraph.commands.cli import main
sys.exit(main({argv!r}))
"""


def check_with_broken(module: str, error: str, argv=("check",)) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VLLM_PP_CUDAGRAPH_") and k != "VLLM_PLUGINS"}
    script = BROKEN_IMPORT.format(module=module, error=error, argv=list(argv))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("module, error, cause, fix, argv", [
    ("torchvision", 'RuntimeError("operator torchvision::nms does not exist")',
     "torchvision {torchvision} is installed but does not import: "
     "RuntimeError: operator torchvision::nms does not exist", "torchvision", ["check"]),
    ("torch", 'OSError("libtorch_cuda.so: cannot open shared object file")',
     "torch {torch} is installed but does not import: OSError: libtorch_cuda.so", "torch",
     ["check"]),
    ("vllm.v1.worker.gpu.model_runner", 'ImportError("undefined symbol: _ZN3c10")',
     "vLLM {vllm} is installed but does not import: ImportError: undefined symbol", "vllm",
     ["check", "--full"]),
])
def test_a_package_that_does_not_import_is_named_with_its_fix(module, error, cause, fix, argv):
    from importlib import metadata

    proc = check_with_broken(module, error, argv)
    versions = {n: metadata.version(n) for n in ("torch", "torchvision", "vllm")}
    assert proc.returncode == cli.EXIT_BROKEN_INSTALL, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert cause.format(**versions) in proc.stdout
    assert "\n    " + install_check.fix_command(fix) + "\n" in proc.stdout
    assert "patches: not listed (an import fails, see above)" in proc.stdout
    if module == "torch":
        assert "GPUs visible: unknown" in proc.stdout


VLLM_LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d ")


def test_vllm_log_lines_stay_out_of_the_report(clean_env):
    """What vLLM's import prints comes after the report, on stderr, under a heading."""
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    proc = subprocess.run([sys.executable, "-m", "vllm_pp_cudagraph.commands.cli", "check", "--full"],
                          capture_output=True, text=True, timeout=300)
    assert "patches when enabled" in proc.stdout
    logged = [line for line in proc.stdout.splitlines() if VLLM_LOG_LINE.match(line)]
    assert logged == []


def test_the_quick_check_leaves_vllms_model_runner_unimported(clean_env):
    """What keeps ``check`` to seconds: vLLM's model-runner stack is for ``--full``."""
    clean_env.setenv("VLLM_PLUGINS", "pp_cudagraph")
    script = ("import io, sys; from vllm_pp_cudagraph.commands.cli import command as cli; cli.check(io.StringIO()); "
              "print('model_runner' in ' '.join(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout + proc.stderr


@pytest.fixture
def model_dir(tmp_path):
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    return str(write_model_dir(tmp_path / "m", "qwen3-0.6b"))


H200_BYTES = 141 * 2**30


def check_engine(model_dir: str, pp: int, gpu_memory_bytes: int | None = None,
                 max_num_seqs: int = cli.DEFAULT_MAX_NUM_SEQS, **engine) -> tuple[int, str]:
    out = io.StringIO()
    facts = EngineFacts(pp, read_model_config(model_dir), max_num_seqs, **engine)
    return cli.check(out, cli.EngineShape(facts, gpu_memory_bytes)), out.getvalue()


def test_check_says_which_layer_partition_a_model_gets_under_auto(gpus, model_dir):
    gpus.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    code, out = check_engine(model_dir, 3, gpu_memory_bytes=H200_BYTES,
                             gpu_memory_utilization=0.9)
    assert code == cli.EXIT_OK
    assert ("layer partition: auto picks 10,10,8 for PP=3 at batch 256 (vLLM's split: "
            "9,10,9)") in out
    assert "  stage 2: layers 20-27 (8), predicted 1.04 ms per step" in out
    assert ("  KV cache 3311330 tokens predicted against 3318927 under vLLM's split "
            "(141.00 GiB of GPU memory x gpu_memory_utilization 0.9)") in out
    # the 0.6B shape's cost table ships with the plugin
    assert ("costs at batch 256 from the cost table "
            "qwen3-h1024-l28-a16kv8d128-i3072-v151936-b2.json (measured)") in out


def test_check_without_a_gpu_or_its_memory_names_the_flag(gpus, model_dir, monkeypatch):
    gpus.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    monkeypatch.setattr(cli, "_gpu_memory_bytes", lambda: None)
    code, out = check_engine(model_dir, 3)
    assert code == cli.EXIT_OK
    assert "layer partition: auto cannot be predicted here" in out and "--gpu-memory-gib" in out


def test_check_predicts_what_the_worker_decides(gpus, model_dir, monkeypatch, tmp_path):
    from _scheduler import make_scheduler

    from vllm_pp_cudagraph.shared.engine_plan import EngineFacts, plan_engine

    gpus.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    for pp in (2, 3, 4):
        config = make_scheduler(model_dir, pp=pp, max_num_seqs=256).vllm_config
        config.cache_config.gpu_memory_utilization = 0.9
        worker = plan_engine(PPCudaGraphSettings.current(), EngineFacts.of(config),
                             H200_BYTES).partition
        _, out = check_engine(model_dir, pp, max_num_batched_tokens=256,
                              gpu_memory_bytes=H200_BYTES, gpu_memory_utilization=0.9)
        lines = [f"layer partition: {worker.describe()[0]}"] + [
            f"  {line}" for line in worker.describe()[1:]]
        assert "\n".join(lines) in out
        assert worker.layers == {2: (14, 14), 3: (10, 10, 8), 4: (7, 7, 7, 7)}[pp]


def test_check_and_plan_show_the_split_the_engines_own_plan_makes(gpus, model_dir,
                                                                   monkeypatch, capsys):
    """``check`` and ``plan`` ask ``plan_engine``, as the engine core and the workers do,
    rather than deciding the split beside it."""
    import dataclasses

    from vllm_pp_cudagraph.shared import layer_partition
    from vllm_pp_cudagraph.commands.planning import plan

    real = plan.plan_engine
    marked = layer_partition.Decision("auto", "the engine's plan picks 5,23", (5, 23))
    monkeypatch.setattr(plan, "plan_engine", lambda *args: dataclasses.replace(
        real(*args), layers=marked.layers, partition=marked))
    _, out = check_engine(model_dir, 2, gpu_memory_bytes=H200_BYTES)
    assert "layer partition: the engine's plan picks 5,23" in out
    code = cli.main(["plan", "--model", model_dir, "--gpus", "2", "--gpu-memory-gib", "141"])
    assert code == cli.EXIT_OK and "the engine's plan picks 5,23" in capsys.readouterr().out


def test_check_says_vllms_split_applies_by_default_and_what_auto_would_pick(gpus, model_dir):
    code, out = check_engine(model_dir, 3, gpu_memory_bytes=H200_BYTES,
                             gpu_memory_utilization=0.9)
    assert code == cli.EXIT_OK
    assert ("layer partition: vLLM's split (VLLM_PP_CUDAGRAPH_LAYER_PARTITION=vllm, the "
            "default): layers 9,10,9 per stage") in out
    assert "with VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto: auto picks 10,10,8" in out
    # Without the GPU's memory, vLLM's split is still known.
    code, out = check_engine(model_dir, 2)
    assert "the default): layers 14,14 per stage" in out


def test_check_names_a_hand_set_partition_and_the_setting_without_a_model(gpus):
    gpus.setenv("VLLM_PP_LAYER_PARTITION", "20,8")
    assert "layer partition: hand-set VLLM_PP_LAYER_PARTITION=20,8" in run_check()[1]
    gpus.delenv("VLLM_PP_LAYER_PARTITION")
    gpus.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    gpus.setattr(settings, "_current", None)  # as a new process reads them
    gpus.setattr(settings, "_hand_set", settings._UNREAD)
    assert "layer partition: auto, chosen per engine at start-up" in run_check()[1]


def test_check_refuses_more_stages_than_layers_under_auto(gpus, model_dir):
    gpus.setenv("VLLM_PP_CUDAGRAPH_LAYER_PARTITION", "auto")
    code, out = check_engine(model_dir, 29)
    assert code == cli.EXIT_MISCONFIGURED
    assert ("layer partition: REFUSED: VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto cannot give "
            "each of 29 pipeline stages a layer") in out


@pytest.mark.parametrize("argv, message", [
    (["check", "--pp", "2"], "--model and --pp go together"),
    (["check", "--model", "/nonexistent", "--pp", "2"], "no readable config.json"),
    (["check", "--model", "M", "--pp", "0"], "--pp must be at least 1"),
    (["check", "--model", "M", "--pp", "2", "--gpu-memory-gib", "0"],
     "--gpu-memory-gib must be positive"),
    (["check", "--model", "M", "--pp", "2", "--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["check", "--model", "M", "--pp", "2", "--max-num-batched-tokens", "8"],
     "at least --max-num-seqs"),
])
def test_check_refuses_bad_engine_arguments(clean_env, capsys, model_dir, argv, message):
    argv = [model_dir if a == "M" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_wrong_argument_is_one_line_and_status_2(clean_env, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--pipeline", "2"])
    err = capsys.readouterr().err
    assert exit_.value.code == cli.EXIT_MISCONFIGURED
    assert err.strip().splitlines() == [
        "vllm-pp-cudagraph: error: unrecognized arguments: --pipeline 2 "
        "(see 'vllm-pp-cudagraph --help')"]


@pytest.mark.parametrize("argv, help_", [
    (["check", "--pp", "2"], "vllm-pp-cudagraph check"),
    (["plan", "--model", "qwen3-32b", "--gpus", "0", "--gpu", "h200"], "vllm-pp-cudagraph plan"),
])
def test_a_commands_bad_setting_points_at_that_commands_help(clean_env, capsys, argv, help_):
    """The error names the command it came from and its own --help, where the flags are."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == cli.EXIT_MISCONFIGURED
    assert err.startswith(f"{help_}: error: --") and err.endswith(f"(see '{help_} --help')")


def test_check_takes_the_built_in_shapes_bench_takes(gpus, capsys):
    code = cli.main(["check", "--model", "qwen3-0.6b", "--pp", "2"])
    assert code == cli.EXIT_OK
    assert "layer partition: vLLM's split" in capsys.readouterr().out


def test_a_bad_setting_is_the_reports_last_line_where_it_is_the_only_problem(gpus):
    """The report runs to some 25 lines: what to fix is repeated at its end."""
    gpus.setenv("VLLM_PP_CUDAGRAPH_DECODE_CADENCE", "sometimes")
    code, out = run_check()
    assert code == cli.EXIT_MISCONFIGURED
    last = out.strip().splitlines()[-1]
    assert last.startswith("to fix: settings: INVALID") and "DECODE_CADENCE='sometimes'" in last
    assert sum(line.startswith("to fix: ") for line in out.splitlines()) == 1


def test_a_sound_install_has_nothing_to_fix(gpus):
    gpus.setenv("VLLM_PLUGINS", "pp_cudagraph")
    assert "to fix:" not in run_check()[1]
