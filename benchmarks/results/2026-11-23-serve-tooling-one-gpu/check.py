"""One GPU, PP=1, vLLM from the GPU kit: the serving tooling that the 2-GPU runs depend on.

1. ``bench``'s serve sweep with ``--profile``: ``vllm serve`` with vLLM's profiler
   config, ``vllm bench serve`` timed passes, one more pass between /start_profile
   and /stop_profile, its traces collected and summarised per stage.
2. The soak's structured requests: the sampling mix with the JSON-schema options
   against ``vllm serve`` of the 0.6B shape with the byte-level vocabulary and
   seeded random weights, every completed structured output checked.

    python3 check.py OUT        (repository root as the working directory)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from benchmarks.tools.sampling_mix import (  # noqa: E402
    SAMPLING_MIX,
    STRUCTURED_MIX,
    STRUCTURED_SERVE_ARGS,
    structured,
)
from benchmarks.tools.serve_checks import byte_vocab_model_dir  # noqa: E402
from benchmarks.tools.soak import soak_prompts  # noqa: E402
from benchmarks.tools.soak_judge import structured_problems  # noqa: E402
from vllm_pp_cudagraph.bench.dummy_model import write_model_dir  # noqa: E402
from vllm_pp_cudagraph.bench.engine_run import RunSpec  # noqa: E402
from vllm_pp_cudagraph.bench.serve_load import LoadSpec  # noqa: E402
from vllm_pp_cudagraph.bench.serve_run import run_serve_mode, run_vllm_bench_sweep  # noqa: E402


def profiled_sweep(out: Path) -> dict:
    model = write_model_dir(tempfile.mkdtemp(prefix="sweep-"), "qwen3-0.6b", tokenizer=True)
    spec = RunSpec("plugin", "full_and_piecewise", pp=1, input_len=64, output_len=128,
                   max_num_seqs=64, workload="serve", repeat=1, weights="dummy",
                   gpu_memory_utilization=0.5, profile_dir=str(out / "traces"))
    start = time.monotonic()
    points = run_vllm_bench_sweep(spec, str(model), out / "sweep.log", [16, 64], 128,
                                  port=8100, startup_timeout_s=420)
    keep = ("concurrency", "req_per_s", "tpot_p50_ms", "tpot_p99_ms", "completed", "failed",
            "gpu_busy_pct", "profile_error", "plugin_stages", "shutdown_clean", "error",
            "jit_compiles")
    result = {"seconds": round(time.monotonic() - start),
              "points": [{k: p.get(k) for k in keep} for p in points],
              "profiles": [p.get("profile") for p in points]}
    result["ok"] = all(p.get("gpu_busy_pct") and len(p["gpu_busy_pct"]) == 1
                       and p.get("req_per_s") for p in points)
    return result


def structured_load(out: Path) -> dict:
    model = byte_vocab_model_dir(tempfile.mkdtemp(prefix="bytes-"), "qwen3-0.6b", weights=True)
    spec = RunSpec("plugin", "full_and_piecewise", pp=1, max_num_seqs=64, weights="random",
                   gpu_memory_utilization=0.5)
    load = LoadSpec("", "", soak_prompts(), 300, 32, 128,
                    sampling_mix=SAMPLING_MIX | STRUCTURED_MIX)
    start = time.monotonic()
    report = run_serve_mode(spec, str(model), load, out / "structured.log", port=8200,
                            startup_timeout_s=420, extra_args=STRUCTURED_SERVE_ARGS,
                            keep_texts=True)
    load_report = report.pop("load_report", None)
    result = {"seconds": round(time.monotonic() - start),
              **{k: report.get(k) for k in ("load", "error", "shutdown_clean", "preemptions")}}
    if load_report is not None:
        done = [r for r in load_report.results if structured(r.sampling) and r.completed]
        problems = structured_problems(load_report)
        result.update(structured_checked=len(done), structured_problems=problems[:20],
                      structured_examples=[r.text for r in done[:5]],
                      errors=[r.error for r in load_report.results if r.error][:10])
        result["ok"] = bool(done) and not problems and not result["errors"]
    log = (out / "structured.log").read_text(errors="replace")
    result["grammar_rejections"] = log.count("grammar rejected tokens")
    return result


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    report = {}
    for name, check in (("profiled_sweep", profiled_sweep), ("structured_load", structured_load)):
        try:
            report[name] = check(out)
        except Exception as exc:  # noqa: BLE001 - record and go on to the next check
            report[name] = {"ok": False, "exception": f"{type(exc).__name__}: {exc}"}
        print(name, json.dumps({k: v for k, v in report[name].items() if k != "profiles"}),
              flush=True)
        (out / "check.json").write_text(json.dumps(report, indent=1))
    return 0 if all(r.get("ok") for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
