#!/usr/bin/env python3
"""Does a vLLM engine start and generate here? One GPU, PP=1, MRV2.

usage: python smoke.py [--random-weights] OUT_DIR [MODE...]
       MODE: eager (default), piecewise, full_and_piecewise

Qwen3-0.6B's shape with vLLM's dummy weights (no download), or with a checkpoint of
seeded random weights written here (--random-weights: greedy tokens then depend on
every layer, so two runners can be compared token for token; the requests are then
queued before the first step, as the bench's `batch` workload does, so that batches
form alike on every run), the Triton attention backend, 8 greedy requests of 32 tokens
per mode, each mode in its own engine, one after another. Prints a RESULT line per
mode and writes OUT_DIR/smoke.json; exits 1 when a mode failed. Stock vLLM unless
VLLM_PLUGINS names this plugin. Run it with the kit on PYTHONPATH (run_checks.sh does).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    random_weights = bool(argv) and argv[0] == "--random-weights"
    argv = argv[1:] if random_weights else argv
    if not argv:
        sys.exit(__doc__)
    out_dir, modes = Path(argv[0]), argv[1:] or ["eager"]
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    os.environ.setdefault("VLLM_PLUGINS", "")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir
    from vllm_pp_cudagraph.commands.bench.engine_run import generate_as_one_batch

    from vllm.platforms import current_platform

    try:  # through NVML: CUDA stays uninitialised here, as vLLM prefers
        gpu = f"{current_platform.device_type}: {current_platform.get_device_name(0)}"
    except Exception as exc:  # noqa: BLE001 - no usable GPU: the engine start says more
        gpu = f"none ({type(exc).__name__}: {exc})"[:200]
    report = {"vllm": vllm.__version__, "torch": torch.__version__, "gpu": gpu,
              "env": {k: os.environ.get(k) for k in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_PLUGINS",
                                                     "VLLM_USE_FLASHINFER_SAMPLER")},
              "runs": {}}
    print("smoke:", json.dumps({k: report[k] for k in ("vllm", "torch", "gpu", "env")}),
          flush=True)
    report["weights"] = "random" if random_weights else "dummy"
    model = str(write_model_dir(tempfile.mkdtemp(), "qwen3-0.6b", weights=random_weights))
    prompts = [TokensPrompt(prompt_token_ids=[1000 + 7 * i + j for j in range(8)]) for i in range(8)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    failed = False
    for mode in modes:
        kwargs = ({"enforce_eager": True} if mode == "eager"
                  else {"compilation_config": {"cudagraph_mode": mode.upper()}})
        start = time.monotonic()
        try:
            llm = LLM(model=model, load_format="auto" if random_weights else "dummy",
                      skip_tokenizer_init=True, seed=0,
                      gpu_memory_utilization=0.4, attention_backend="TRITON_ATTN",
                      max_model_len=512, max_num_seqs=16, **kwargs)
            init_s = time.monotonic() - start
            start = time.monotonic()
            outputs = (generate_as_one_batch(llm, prompts, params) if random_weights
                       else llm.generate(prompts, params))
            tokens = [list(o.outputs[0].token_ids) for o in outputs]
            run = {"ok": all(len(t) == 32 for t in tokens), "init_s": round(init_s, 1),
                   "generate_s": round(time.monotonic() - start, 2), "tokens": tokens}
            del llm
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            traceback.print_exc()
            run = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                   "after_s": round(time.monotonic() - start, 1)}
        failed |= not run["ok"]
        report["runs"][mode] = run
        print("RESULT", mode, json.dumps({k: v for k, v in run.items() if k != "tokens"}),
              flush=True)
        gc.collect()
    (out_dir / "smoke.json").write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
