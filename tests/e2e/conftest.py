"""What the GPU checks need: two visible CUDA devices, a model.

Every test here is marked ``gpu``; CPU runs skip them (see the top-level
conftest), and they collect everywhere. Run them on a host with 2 GPUs as
``benchmarks/README.md`` says (section "GPU tests").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

def shared_gpu_ranks() -> int:
    """How many ranks the test-only shim (benchmarks/gpu_kit/shared_gpu, loaded as
    ``sitecustomize``) puts on GPU 0: a correctness check where no multi-GPU host is at
    hand. 0 without the shim."""
    return getattr(sys.modules.get("sitecustomize"), "STAGES", 0)


def stages_share_one_gpu() -> bool:
    """Whether this run puts the stages on one GPU through the shim."""
    return shared_gpu_ranks() >= 2


def require_gpus(ranks: int) -> None:
    """Skip unless ``ranks`` CUDA devices are visible, or one is and the shim puts at least
    ``ranks`` ranks on it."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < ranks and not (count == 1 and shared_gpu_ranks() >= ranks):
        pytest.skip(f"needs {ranks} CUDA devices (one per rank), or one with "
                    f"KIT_SHARED_GPU_STAGES={ranks} and the shim; {count} visible")


@pytest.fixture
def two_gpus() -> None:
    """Skip unless 2 CUDA devices are visible: every check runs PP=2, one GPU per stage
    (or both stages on one, with the shared-GPU shim loaded)."""
    require_gpus(2)


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-0.6B's shape with seeded random weights, written once per session.

    Random weights make greedy outputs depend on every layer, so a mishandled
    hand-off between stages changes tokens.
    """
    from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("model"), "qwen3-0.6b", weights=True)
