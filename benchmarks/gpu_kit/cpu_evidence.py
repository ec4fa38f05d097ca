#!/usr/bin/env python3
"""What a vLLM build does under the running torch, found on a CPU machine (README.md).

usage: python cpu_evidence.py OUT.json

Run it with the torch to test (e.g. the GPU image's 2.11.0+cu130) and the vLLM to
test first on PYTHONPATH (an unpacked wheel will do). No GPU is needed, but the
extensions link the NVIDIA driver library: on a machine without one, put a stub
libcuda.so.1 on LD_LIBRARY_PATH (README.md says how). It records:

- which of vLLM's compiled extensions load, and the ops they register (with
  schemas and whether a CUDA kernel is registered);
- the results of the ops that run without a GPU (capability queries, machete's
  schedule list), which pass ints, bools, dtypes, optionals and string lists
  through torch's stable-ABI dispatcher;
- every ``torch.*`` name vLLM's Python sources use that this torch lacks.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")

EXTENSIONS = (
    "vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C",
    "vllm.vllm_flash_attn._vllm_fa2_C", "vllm._flashmla_C", "vllm._flashmla_extension_C",
    "vllm._flashkda_C", "vllm._deepselect_C", "vllm._qutlass_C", "vllm.cumem_allocator",
)
NAMESPACES = ("_C", "_C_cache_ops", "_C_custom_ar", "_C_utils", "_moe_C", "_vllm_fa2_C",
              "_vllm_fa3_C", "_flashmla_C", "_flashmla_extension_C", "_flashkda_C",
              "_deepselect_C", "_qutlass_C")
CAPABILITY_QUERIES = ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_fp4",
                      "cutlass_scaled_mm_supports_block_fp8", "cutlass_group_gemm_supported",
                      "mxfp4_experts_quant_supported")


def extensions(torch) -> dict:
    loaded = {}
    for name in EXTENSIONS:
        try:
            importlib.import_module(name)
            loaded[name] = "loaded"
        except ModuleNotFoundError as exc:
            loaded[name] = f"absent ({exc})"
        except Exception as exc:  # noqa: BLE001 - the message is the finding
            loaded[name] = f"{type(exc).__name__}: {exc}"
    ops = {}
    # Names come per overload ("_C::op.out"); one entry per op, all overloads in it.
    for op in sorted({n.split(".")[0] for n in torch._C._dispatch_get_all_op_names()}):
        namespace, name = op.split("::", 1)
        if namespace not in NAMESPACES:
            continue
        packet = getattr(getattr(torch.ops, namespace), name)
        ops[op] = {
            "schemas": [str(getattr(packet, o)._schema) for o in packet.overloads()],
            "cuda_kernel": torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"),
        }
    return {"extensions": loaded, "ops": ops}


def cpu_calls(torch) -> dict:
    results = {}
    for name in CAPABILITY_QUERIES:
        op = getattr(torch.ops._C, name, None)
        results[f"{name}(90)"] = None if op is None else op(90)
    from vllm.scalar_type import scalar_types

    schedules = torch.ops._C.machete_supported_schedules(
        torch.bfloat16, scalar_types.uint4b8.id, torch.bfloat16, None, None, None, None)
    results["machete_supported_schedules(bf16, uint4b8, bf16)"] = list(schedules)
    results["sm100_cutlass_mla_get_workspace_size(128, 8, 132, 1)"] = (
        torch.ops._C.sm100_cutlass_mla_get_workspace_size(128, 8, 132, 1))
    return results


def torch_references(root: Path) -> dict[str, list[str]]:
    """``torch.a.b`` chains and ``from torch.x import y`` names, with where they occur."""
    refs: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(), str(path))
        except (SyntaxError, UnicodeDecodeError):
            continue
        where = str(path.relative_to(root.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                parts, cur = [], node
                while isinstance(cur, ast.Attribute):
                    parts.append(cur.attr)
                    cur = cur.value
                if isinstance(cur, ast.Name) and cur.id == "torch":
                    refs.setdefault(".".join(["torch", *reversed(parts)]), []).append(
                        f"{where}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == "torch":
                for alias in node.names:
                    refs.setdefault(f"{node.module}:{alias.name}", []).append(
                        f"{where}:{node.lineno}")
    return refs


def resolves(torch, ref: str) -> bool | None:
    """False: this torch lacks it; None: it continues into an object's attributes."""
    if ":" in ref:
        module, name = ref.split(":")
        try:
            found = importlib.import_module(module)
        except Exception:  # noqa: BLE001
            return False
        if hasattr(found, name):
            return True
        try:
            importlib.import_module(f"{module}.{name}")
            return True
        except Exception:  # noqa: BLE001
            return False
    parts = ref.split(".")
    if parts[1] in ("ops", "classes"):
        return None
    obj, prefix = torch, "torch"
    for part in parts[1:]:
        prefix += "." + part
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(prefix)
        except Exception:  # noqa: BLE001
            return False if isinstance(obj, type(torch)) else None
    return True


def main() -> None:
    import torch
    import vllm

    report = {"torch": torch.__version__, "vllm": vllm.__version__}
    report.update(extensions(torch))
    try:
        report["cpu_calls"] = cpu_calls(torch)
    except Exception as exc:  # noqa: BLE001
        report["cpu_calls"] = f"{type(exc).__name__}: {exc}"
    refs = torch_references(Path(vllm.__file__).parent)
    report["torch_references"] = len(refs)
    report["torch_names_missing"] = {ref: where[:5] for ref, where in sorted(refs.items())
                                     if resolves(torch, ref) is False}
    # Where this machine keeps vLLM is no part of the finding.
    text = json.dumps(report, indent=1).replace(str(Path(vllm.__file__).parent.parent), "<site>")
    Path(sys.argv[1]).write_text(text)
    loaded = sum(v == "loaded" for v in report["extensions"].values())
    print(f"torch {report['torch']}, vLLM {report['vllm']}: {loaded} extensions loaded, "
          f"{len(report['ops'])} ops ({sum(o['cuda_kernel'] for o in report['ops'].values())} "
          f"with a CUDA kernel), {len(report['torch_names_missing'])} torch names missing")


if __name__ == "__main__":
    main()
