#!/usr/bin/env python3
"""Check an installed kit on a CPU machine before GPU time is spent on it (README.md).

usage: python cpu_kit_check.py SITE OUT.json [--engine] [--sweep]

Run it with the GPU image's Python and torch stack (or an approximation: torch
2.11.0+cu130 and image-packages.txt from the package index), SITE holding the kit
as install.sh installs it plus this package, and LD_LIBRARY_PATH holding the stubs
built from stub_libcuda.c and stub_libnvml.c: vLLM then detects its CUDA platform
itself, through its own pynvml copy, as on the GPU hosts (two H200s, compute
capability 9.0), while torch sees no CUDA device. It records:

- the platform vLLM detects;
- each module an engine start needs, imported in a fresh interpreter (the ones
  earlier kits lacked: vLLM's pynvml copy, FlashInfer, MRV2's runner and sampler);
- with --engine, PP=2 engine configs for stock and the plugin, and how far the
  bench's engine child gets (the workers stop where they first need CUDA);
- with --sweep, every module of vLLM imported in one interpreter, and for each
  that fails on a missing module, which one: a left-out package (leave-out.txt) is
  expected, and so is a package vLLM never requires (absent from a plain install
  too); a module of vLLM itself that the kit cut, a package vLLM requires that is
  neither brought nor in the image, or a submodule the image's version of a package
  lacks is what the kit may still lack (exit status 1 for the middle one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: What an engine start imports, in the order the brief of the last GPU attempt asked.
MODULES = (
    "vllm",
    "vllm.third_party.pynvml",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.vllm_flash_attn",
    "vllm.model_executor.models.qwen3",
    "vllm.v1.executor.multiproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.entrypoints.llm",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.main",
    "flashinfer",
    "flashinfer.sampling",
    "vllm_pp_cudagraph.plugin",
    "vllm_pp_cudagraph.worker.model_runner",
    "vllm_pp_cudagraph.commands.bench.engine_run",
)

PLATFORM = r"""
import json, torch
from vllm.platforms import current_platform as p
out = {"torch": torch.__version__, "torch_cuda_available": torch.cuda.is_available(),
       "platform": type(p).__name__, "device_type": p.device_type}
if p.device_type == "cuda":
    out["capability"] = str(p.get_device_capability())
    out["device_name"] = p.get_device_name()
print(json.dumps(out))
"""

SWEEP = r"""
import importlib, json, pkgutil, sys, warnings
warnings.filterwarnings("ignore")
import vllm
failed = {}
names = [m.name for m in pkgutil.walk_packages(vllm.__path__, "vllm.", onerror=lambda n: None)]
for name in names:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        failed[name] = {"error": f"{type(exc).__name__}: {exc}"[:300], "missing": missing}
print("SWEEP " + json.dumps({"modules": len(names), "failed": failed}))
"""


#: Import names of left-out packages that differ from the package's name.
IMPORT_NAMES = {"cutlass": "nvidia-cutlass-dsl", "cudnn": "nvidia-cudnn-frontend",
                "quack": "quack-kernels", "cuda-tile": "cuda-tile", "z3": "z3-solver"}


def vllm_requirements(site: Path) -> set[str]:
    """vLLM's own requirements (no extras), by normalised name."""
    from importlib import metadata

    dist = metadata.Distribution.at(next(site.glob("vllm-*.dist-info")))
    names = set()
    for line in dist.requires or []:
        if "extra ==" not in line:
            names.add(line.split(";")[0].split("[")[0].split("=")[0].split("<")[0]
                      .split(">")[0].split("!")[0].split("~")[0].strip().lower().replace("_", "-"))
    return names


def installed(module: str) -> bool:
    """Whether ``module``'s top-level package is there (its version may lack ``module``)."""
    import importlib.util

    return importlib.util.find_spec(module.split(".")[0]) is not None


ENGINE_CONFIG = r"""
import json, sys, tempfile
from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
from vllm.engine.arg_utils import EngineArgs
from vllm.plugins import load_general_plugins
load_general_plugins()
model = str(write_model_dir(tempfile.mkdtemp(), "qwen3-0.6b"))
out = {}
for mode in ("FULL_AND_PIECEWISE", "PIECEWISE"):
    args = EngineArgs(model=model, skip_tokenizer_init=True, load_format="dummy",
                      pipeline_parallel_size=2, attention_backend="TRITON_ATTN",
                      max_model_len=1024, max_num_seqs=128, compilation_config={"cudagraph_mode": mode})
    try:
        cfg = args.create_engine_config()
        out[mode] = {"ok": True, "cudagraph_mode": str(cfg.compilation_config.cudagraph_mode),
                     "pp": cfg.parallel_config.pipeline_parallel_size}
    except BaseException as exc:
        out[mode] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
print("CONFIG " + json.dumps(out))
"""

ENGINE_START = r"""
import json, sys, tempfile
from pathlib import Path
from vllm_pp_cudagraph.commands.bench.engine_run import RunSpec, run_in_subprocess
from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
model = str(write_model_dir(tempfile.mkdtemp(), "qwen3-0.6b"))
logs = Path(tempfile.mkdtemp())
out = {}
for runner in ("stock", "plugin"):
    spec = RunSpec(runner=runner, mode="full_and_piecewise", pp=2, prompts=8, input_len=2,
                   output_len=16, output_len_spread=0, max_num_seqs=8, workload="batch", repeat=0,
                   shape="qwen3-0.6b", model=model, weights="dummy", attention_backend="TRITON_ATTN",
                   gpu_memory_utilization=0.5, profile_dir=None)
    report = run_in_subprocess(spec, logs / f"{runner}.log", 300)
    log = (logs / f"{runner}.log").read_text(errors="replace").splitlines()
    out[runner] = {"returncode": report["returncode"], "digest": report.get("digest"),
                   "workers_started": sum("world_size=2" in line for line in log),
                   "first_error": next((l for l in log if "Error:" in l), None)}
print("START " + json.dumps(out))
"""


def leave_out() -> set[str]:
    names = set()
    for line in (HERE / "leave-out.txt").read_text().splitlines():
        name = line.split("#")[0].strip()
        if name:
            names.add(name.lower().replace("_", "-"))
    return names


def run(code: list[str], timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, *code], capture_output=True, text=True,
                              timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start
    except subprocess.TimeoutExpired as exc:
        return -1, f"timed out after {timeout} s: {exc.stdout or ''}", time.monotonic() - start


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.exit(__doc__)
    site, out_path, sweep = Path(argv[0]).resolve(), Path(argv[1]), "--sweep" in argv
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    report: dict = {"site": "SITE", "python": sys.version.split()[0]}
    rc, text, _ = run(["-c", PLATFORM], 300)
    lines = [line for line in text.splitlines() if line.startswith("{")]
    report["platform"] = json.loads(lines[-1]) if rc == 0 and lines else text[-1500:]
    print("platform:", report["platform"], flush=True)
    report["imports"] = {}
    for module in MODULES:
        rc, text, seconds = run(["-c", f"import {module}"], 600)
        tail = [line for line in text.splitlines() if line.strip()][-1:] if rc else []
        report["imports"][module] = {"ok": rc == 0, "seconds": round(seconds, 1),
                                     **({"error": tail[0][:400]} if tail else {})}
        print(f"import {module}: {'ok' if rc == 0 else 'FAILED ' + (tail or [''])[0][:300]}",
              flush=True)
    if "--engine" in argv:
        # As far as an engine gets without a GPU: PP=2 configs for stock and the plugin
        # (plugins loaded), then the bench's own engine child, which is expected to stop
        # where the workers first need CUDA (init_device).
        env_v2 = {**os.environ, "VLLM_USE_V2_MODEL_RUNNER": "1"}
        report["engine"] = {}
        for plugins in ("", "pp_cudagraph"):
            proc = subprocess.run([sys.executable, "-c", ENGINE_CONFIG], capture_output=True,
                                  text=True, env={**env_v2, "VLLM_PLUGINS": plugins}, timeout=600)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CONFIG ")), None)
            report["engine"][f"config VLLM_PLUGINS={plugins!r}"] = (
                json.loads(line[7:]) if line else (proc.stdout + proc.stderr)[-1500:])
        proc = subprocess.run([sys.executable, "-c", ENGINE_START], capture_output=True,
                              text=True, timeout=900)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("START ")), None)
        report["engine"]["start (bench engine child)"] = (
            json.loads(line[6:]) if line else (proc.stdout + proc.stderr)[-1500:])
        for key, value in report["engine"].items():
            print(f"engine {key}: {json.dumps(value)[:600]}", flush=True)
    if sweep:
        rc, text, seconds = run(["-c", SWEEP], 3000)
        line = next((ln for ln in text.splitlines() if ln.startswith("SWEEP ")), None)
        if line is None:
            report["sweep"] = {"error": text[-3000:]}
        else:
            result = json.loads(line[len("SWEEP "):])
            left_out, required = leave_out(), vllm_requirements(site)
            by_missing: dict[str, list[str]] = {}
            for module, failure in result["failed"].items():
                by_missing.setdefault(failure["missing"] or "", []).append(module)
            # Where each missing module comes from: a left-out package (expected), vLLM
            # itself (what the kit cut: DeepGEMM), a package vLLM requires that is neither
            # brought nor in the image (the kit lacks it), or an optional package vLLM
            # never requires (absent from any plain install too).
            kinds: dict[str, dict[str, list[str]]] = {
                "left_out": {}, "vllm_itself": {}, "required_not_there": {},
                "submodule_of_installed": {}, "optional": {}, "not_a_missing_module": {}}
            for missing, modules in sorted(by_missing.items()):
                top = missing.split(".")[0].lower().replace("_", "-")
                package = IMPORT_NAMES.get(top, top)
                if not missing:
                    kind = "not_a_missing_module"
                    for module in modules:
                        error = result["failed"][module]["error"].split(":")[0]
                        kinds[kind].setdefault(error, []).append(module)
                    continue
                kind = ("vllm_itself" if top == "vllm" else "left_out" if package in left_out
                        else "submodule_of_installed" if "." in missing and installed(missing)
                        else "required_not_there" if package in required else "optional")
                kinds[kind][missing] = modules
            report["sweep"] = {
                "modules": result["modules"], "failed": len(result["failed"]),
                "seconds": round(seconds), **kinds, "errors": result["failed"],
            }
            print(f"sweep: {result['modules']} vLLM modules, {len(result['failed'])} failed "
                  f"to import ({seconds:.0f} s)")
            for kind, groups in kinds.items():
                for missing, modules in groups.items():
                    print(f"  {kind}: {missing}: {len(modules)} modules, e.g. {modules[:2]}")
    out_path.write_text(json.dumps(report, indent=1))
    bad = [m for m, r in report["imports"].items() if not r["ok"]]
    return 1 if bad or report.get("sweep", {}).get("required_not_there") else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
