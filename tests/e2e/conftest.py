"""What the GPU checks need: two visible CUDA devices, the test plugins, a model.

Every test here is marked ``gpu``; CPU runs skip them (see the top-level
conftest), and they collect everywhere. Run them on a host with 2 GPUs as
``benchmarks/README.md`` says (section "GPU tests").
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: The test-only vLLM plugins in tests/e2e/soak_plugins, by entry-point name.
TEST_PLUGINS = ("pp_e2e_models", "pp_e2e_preemption_fix")


@pytest.fixture
def two_gpus() -> None:
    """Skip unless 2 CUDA devices are visible: every check runs PP=2, one GPU per stage."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
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
