"""One GPU, PP=1, vLLM from the GPU kit: the bench's engine child for the runners the
2-GPU cells use, V1 included, with the profiled pass (``--profile``).

Each engine runs as ``bench`` runs it (``run_in_subprocess``): the ``engine`` workload,
64 prompts x 128 tokens, Qwen3-0.6B shape, dummy weights, FULL_AND_PIECEWISE, a
warm-up and one timed pass, then one pass under vLLM's profiler.

    python3 engines.py OUT        (repository root as the working directory)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vllm_pp_cudagraph.bench.engine_run import RunSpec, run_in_subprocess


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for runner in ("v1", "stock", "plugin"):
        spec = RunSpec(runner, "full_and_piecewise", pp=1, prompts=64, input_len=16,
                       output_len=128, max_num_seqs=64, workload="engine", repeat=1,
                       weights="dummy", gpu_memory_utilization=0.5,
                       profile_dir=str(out / "traces" / runner))
        report = run_in_subprocess(spec, out / f"{runner}.log", timeout_s=420)
        keep = ("req_per_s", "tpot_mean_ms", "gpu_busy_pct", "plugin_stages", "jit_compiles",
                "returncode", "timed_out_after_s", "error_tail")
        results[runner] = {k: report.get(k) for k in keep}
        results[runner]["ok"] = bool(report.get("digest") and report.get("gpu_busy_pct"))
        print(runner, json.dumps(results[runner])[:600], flush=True)
        (out / "engines.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
