"""Test models for the serving soak, registered with vLLM as a general plugin.

``StageMismatchQwen3ForCausalLM`` is Qwen3 whose last pipeline stage expects a
tensor (``aux``) that the stage before it never sends: the case of stages
that exchange tensors the receiving buffers do not expect. Stock vLLM fails on
it at the first request with a bare ``KeyError``; the plugin must refuse it at
start-up, naming the key.
"""

STAGE_MISMATCH_ARCH = "StageMismatchQwen3ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    # By name, so the model module (and CUDA) is only imported where a model loads.
    ModelRegistry.register_model(
        STAGE_MISMATCH_ARCH, f"pp_e2e_models.stage_mismatch:{STAGE_MISMATCH_ARCH}"
    )
