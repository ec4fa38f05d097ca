"""The GPUs ``plan`` knows: memory, memory bandwidth and dense BF16 FLOPs from each
vendor datasheet, and the bytes/FLOPs model's rates scaled to them."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_pp_cudagraph.shared.stage_costs import FITTED, Rates


@dataclass(frozen=True)
class Gpu:
    """One GPU model's datasheet row (SXM parts unless named)."""

    name: str
    memory_gib: float
    bytes_per_s: float
    bf16_flops: float
    #: Words that name it in ``torch.cuda.get_device_name()`` (all must appear).
    device_words: tuple[str, ...]


GPUS: dict[str, Gpu] = {
    "h200": Gpu("H200", 141, 4.8e12, 989e12, ("H200",)),
    "h100": Gpu("H100 SXM", 80, 3.35e12, 989e12, ("H100", "HBM3")),
    "h100-pcie": Gpu("H100 PCIe", 80, 2.0e12, 756e12, ("H100", "PCIe")),
    "a100": Gpu("A100 SXM 80GB", 80, 2.039e12, 312e12, ("A100", "80GB")),
    "a100-40gb": Gpu("A100 40GB", 40, 1.555e12, 312e12, ("A100", "40GB")),
    "l40s": Gpu("L40S", 48, 0.864e12, 362e12, ("L40S",)),
}

#: The GPU the model's rates were fitted on.
FITTED_ON = GPUS["h200"]


def by_device_name(device: str) -> Gpu | None:
    """The row for a device name as torch or a cost table gives it, or None."""
    return next((gpu for gpu in GPUS.values()
                 if all(word.lower() in device.lower() for word in gpu.device_words)), None)


def rates(gpu: Gpu) -> Rates:
    """The model's rates on ``gpu``: the fitted H200 rates times the datasheets' ratios.
    A cost table measured on another known GPU converts through the rates of that GPU."""
    def table_rates(device: str) -> Rates | None:
        measured_on = by_device_name(device)
        return None if measured_on is None or measured_on == gpu else rates(measured_on)

    return Rates(FITTED.bytes_per_s * gpu.bytes_per_s / FITTED_ON.bytes_per_s,
                 FITTED.flops_per_s * gpu.bf16_flops / FITTED_ON.bf16_flops,
                 name=gpu.name, table_rates=table_rates)
