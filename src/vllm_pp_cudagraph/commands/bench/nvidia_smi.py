"""``nvidia-smi`` queries about the GPUs the bench's engines get: no CUDA context in the
bench's own process, and ``CUDA_VISIBLE_DEVICES`` picks the GPUs as it does for the engines."""

from __future__ import annotations

import os
import subprocess


def query(*args: str) -> list[str] | None:
    """``nvidia-smi``'s CSV lines for ``args`` (no header, no units), or None where it
    cannot be run."""
    try:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.splitlines() if line.strip()]


def query_visible_gpus(field: str) -> list[str] | None:
    """``field`` of each GPU the engines may use, a line each; [] where
    ``CUDA_VISIBLE_DEVICES`` hides them all, None where ``nvidia-smi`` cannot be run."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return []
    return query(f"--query-gpu={field}", *(["-i", visible] if visible else []))
