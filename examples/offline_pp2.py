"""Offline generation at pipeline-parallel size 2 with vllm-pp-cudagraph.

Needs 2 NVIDIA GPUs (one per pipeline stage). The model comes from the
Hugging Face hub unless MODEL is a local directory.

    python examples/offline_pp2.py [MODEL] [--load-format dummy]
"""

from __future__ import annotations

import argparse
import os
import sys

# Before vLLM starts its processes, which inherit the environment.
os.environ.setdefault("VLLM_PLUGINS", "pp_cudagraph")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="Qwen/Qwen3-0.6B",
                        help="hub name or local model directory (default: %(default)s)")
    parser.add_argument("--load-format", default="auto",
                        help="'dummy' runs without weights (random outputs; default: %(default)s)")
    args = parser.parse_args()

    import torch

    # Counting devices must not initialise CUDA here: vLLM's worker processes would
    # inherit it. Workers are spawned, the start method that tolerates it.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"This example needs 2 NVIDIA GPUs (pipeline_parallel_size=2); {gpus} visible.",
              file=sys.stderr)
        return 2

    from vllm import LLM, SamplingParams

    llm = LLM(args.model, pipeline_parallel_size=2, load_format=args.load_format,
              max_model_len=1024, gpu_memory_utilization=0.5)
    prompts = ["The capital of France is", "Pipeline parallelism splits a model", "1, 2, 3,"]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0))
    for output in outputs:
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
