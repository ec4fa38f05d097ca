"""Offline generation at pipeline-parallel size 2 with vllm-pp-cudagraph.

Needs 2 NVIDIA GPUs (one per pipeline stage), vLLM and vllm-pp-cudagraph.
MODEL is a Hugging Face hub name or a local model directory.

    python examples/offline_pp2.py [MODEL] [--load-format dummy]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from pathlib import Path

# Before vLLM starts its processes, which inherit the environment.
os.environ.setdefault("VLLM_PLUGINS", "pp_cudagraph")


def missing(model: str) -> str | None:
    """What this example lacks, and what to do about it; None when nothing."""
    if importlib.util.find_spec("vllm") is None:
        return 'vLLM is not installed. Install it with: pip install "vllm==0.26.0"'
    if importlib.util.find_spec("vllm_pp_cudagraph") is None:
        return "vllm-pp-cudagraph is not installed. Install it from its checkout: pip install ."
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        return (f"the model directory {model} does not exist. Give an existing directory "
                "or a Hugging Face hub name such as Qwen/Qwen3-0.6B.")
    import torch

    # Counting devices must not initialise CUDA here: vLLM's worker processes would
    # inherit it. Workers are spawned, the start method that tolerates it.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    with warnings.catch_warnings(record=True) as driver_fault:  # torch warns, counts 0
        gpus = torch.cuda.device_count()
    if gpus < 2:
        why = f" ({str(driver_fault[0].message).rstrip('.')})" if driver_fault else ""
        return (f"this example needs 2 NVIDIA GPUs (pipeline_parallel_size=2); "
                f"{gpus} visible{why}. Run it on a machine with 2 GPUs.")
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="Qwen/Qwen3-0.6B",
                        help="hub name or local model directory (default: %(default)s)")
    parser.add_argument("--load-format", default="auto",
                        help="'dummy' runs without weights (random outputs; default: %(default)s)")
    args = parser.parse_args()
    if problem := missing(args.model):
        sys.exit(f"{parser.prog}: {problem}")

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
