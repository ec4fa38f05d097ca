"""What the GPU checks need: two visible CUDA devices, the test plugins, a model.

Every test here is marked ``gpu``; CPU runs skip them (see the top-level
conftest), and they collect everywhere. Run them on a host with 2 GPUs as
``benchmarks/README.md`` says (section "GPU tests").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

#: The test-only vLLM plugins in tests/e2e/soak_plugins, by entry-point name.
TEST_PLUGINS = ("pp_e2e_models", "pp_e2e_preemption_fix")


def stages_share_one_gpu() -> bool:
    """Whether this run puts both stages on one GPU (benchmarks/gpu_kit/shared_gpu,
    loaded as ``sitecustomize``): a correctness check where no 2-GPU host is at hand."""
    return getattr(sys.modules.get("sitecustomize"), "STAGES", 0) >= 2


@pytest.fixture
def two_gpus() -> None:
    """Skip unless 2 CUDA devices are visible: every check runs PP=2, one GPU per stage
    (or both stages on one, with the shared-GPU shim loaded)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2 and not (count == 1 and stages_share_one_gpu()):
        pytest.skip(f"needs 2 CUDA devices (PP=2, one per stage); {count} visible")


@pytest.fixture
def test_plugins() -> None:
    """Fail, naming the install command, where the soak's test plugins are missing."""
    from benchmarks.tools.soak import missing_test_plugin

    missing = [why for name in TEST_PLUGINS if (why := missing_test_plugin(name))]
    if missing:
        pytest.fail("; ".join(missing) + " (the GPU checks' test-only vLLM plugins)")


@pytest.fixture(scope="session")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3-0.6B's shape with seeded random weights, written once per session.

    Random weights make greedy outputs depend on every layer, so a mishandled
    hand-off between stages changes tokens.
    """
    from vllm_pp_cudagraph.bench.dummy_model import write_model_dir

    return write_model_dir(tmp_path_factory.mktemp("model"), "qwen3-0.6b", weights=True)
