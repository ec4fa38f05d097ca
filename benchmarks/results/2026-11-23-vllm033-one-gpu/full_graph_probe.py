#!/usr/bin/env python3
"""Which graph serves each step, and the greedy tokens, for one runner variant.

usage: python full_graph_probe.py OUT.json VARIANT      VARIANT: stock, plugin,
       plugin-vllm-manager (the plugin's runner keeping vLLM's own graph manager)

One GPU, PP=1, FULL_AND_PIECEWISE, Qwen3-0.6B's shape with seeded random weights,
the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that vLLM's
dispatch can be recorded: every descriptor it returns is counted. The same prompts
and sampling as smoke.py. Run with the kit on PYTHONPATH.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path


def main(out: str, variant: str) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    os.environ["VLLM_PLUGINS"] = "" if variant == "stock" else "pp_cudagraph"
    import vllm.v1.worker.gpu.cudagraph_utils as cgu
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

    dispatched: collections.Counter[str] = collections.Counter()
    managers: set[str] = set()
    original = cgu.CudaGraphManager.dispatch

    def dispatch(self, *args, **kwargs):
        desc = original(self, *args, **kwargs)
        managers.add(type(self).__name__)
        dispatched[f"{desc.cg_mode.name} tokens={desc.num_tokens} reqs={desc.num_reqs} "
                   f"uniform={desc.uniform_token_count}"] += 1
        return desc

    cgu.CudaGraphManager.dispatch = dispatch
    if variant == "plugin-vllm-manager":
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        import vllm_pp_cudagraph.model_runner as plugin_runner

        def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):
            GPUModelRunner.initialize_kv_cache(self, kv_cache_config, *args, **kwargs)

        plugin_runner.PPCudaGraphModelRunner.initialize_kv_cache = initialize_kv_cache

    model_dir = Path("/tmp/probe-model")
    if not (model_dir / "config.json").exists():
        write_model_dir(model_dir, "qwen3-0.6b", weights=True)
    prompts = [TokensPrompt(prompt_token_ids=[1000 + 7 * i + j for j in range(8)]) for i in range(8)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    start = time.monotonic()
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, seed=0, gpu_memory_utilization=0.4,
              attention_backend="TRITON_ATTN", max_model_len=512, max_num_seqs=16,
              compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE"})
    init_s = time.monotonic() - start
    dispatched.clear()  # count serving steps only, not warm-up and capture
    outputs = llm.generate(prompts, params)
    report = {"variant": variant, "init_s": round(init_s, 1), "managers": sorted(managers),
              "dispatched": dict(dispatched),
              "tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    Path(out).write_text(json.dumps(report, indent=1))
    print("PROBE", variant, json.dumps({k: v for k, v in report.items() if k != "tokens"}),
          flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
