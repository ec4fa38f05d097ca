"""Test models for the serving soak, registered with vLLM as a general plugin.

``StageMismatchQwen3ForCausalLM`` is Qwen3 whose last pipeline stage expects a
tensor (``aux``) that the stage before it never sends. Stock vLLM fails on it
at the first request with a bare ``KeyError``.

``UndeclaredOutputQwen3ForCausalLM`` is Qwen3 whose non-last stages send a
tensor (``aux``) their model never declares. Stock vLLM silently drops it.

The plugin must refuse both at start-up, naming the key.

``StageFaultQwen3ForCausalLM`` is Qwen3 whose first or last stage raises inside
a serving step while a file exists (``stage_fault``): the fault-injection check.

"""

STAGE_MISMATCH_ARCH = "StageMismatchQwen3ForCausalLM"
UNDECLARED_OUTPUT_ARCH = "UndeclaredOutputQwen3ForCausalLM"
STAGE_FAULT_ARCH = "StageFaultQwen3ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    # By name, so the model module (and CUDA) is only imported where a model loads.
    for arch in (STAGE_MISMATCH_ARCH, UNDECLARED_OUTPUT_ARCH):
        ModelRegistry.register_model(arch, f"pp_e2e_models.stage_mismatch:{arch}")
    ModelRegistry.register_model(STAGE_FAULT_ARCH, f"pp_e2e_models.stage_fault:{STAGE_FAULT_ARCH}")
