"""The ``vllm-pp-cudagraph`` command: ``check``, ``plan`` and ``bench`` (its own package)."""

from vllm_pp_cudagraph.commands.cli.command import main

__all__ = ["main"]
