"""What the offline examples share: their arguments and the check of what they need.

Each example imports this from its own folder (``python examples/NAME.py`` puts
that folder first on the module path), before it imports vLLM.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import warnings
from pathlib import Path


def missing(model: str) -> str | None:
    """What an example lacks, and what to do about it; None when nothing."""
    if importlib.util.find_spec("vllm") is None:
        return 'vLLM is not installed. Install it with: pip install "vllm==0.33.0"'
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


def model_arguments(doc: str) -> argparse.Namespace:
    """The example's MODEL and --load-format; exits with one line if it lacks something."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="Qwen/Qwen3-0.6B",
                        help="hub name or local model directory (default: %(default)s)")
    parser.add_argument("--load-format", default="auto",
                        help="'dummy' runs without weights (random outputs; default: %(default)s)")
    args = parser.parse_args()
    if problem := missing(args.model):
        sys.exit(f"{parser.prog}: {problem}")
    return args
