"""Offline generation at pipeline-parallel size 2 with vllm-pp-cudagraph.

Needs 2 NVIDIA GPUs (one per pipeline stage), vLLM and vllm-pp-cudagraph.
MODEL is a Hugging Face hub name or a local model directory.

    python examples/offline_pp2.py [MODEL] [--load-format dummy]
"""

from __future__ import annotations

import os
import sys

from _example import model_arguments

# Before vLLM starts its processes, which inherit the environment.
os.environ.setdefault("VLLM_PLUGINS", "pp_cudagraph")


def main() -> int:
    args = model_arguments(__doc__)

    from vllm import LLM, SamplingParams

    llm = LLM(os.path.expanduser(args.model), pipeline_parallel_size=2,
              load_format=args.load_format, max_model_len=1024, gpu_memory_utilization=0.5)
    prompts = ["The capital of France is", "Pipeline parallelism splits a model", "1, 2, 3,"]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0))
    for output in outputs:
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
