"""The ``vllm-pp-cudagraph`` command: ``check``, ``plan`` and ``bench`` (its own package).

``main`` is imported on first use, so the exit statuses load without the command."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "main":
        from vllm_pp_cudagraph.cli.command import main

        return main
    raise AttributeError(name)
