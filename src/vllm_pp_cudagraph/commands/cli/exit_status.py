"""The exit statuses ``check`` and ``bench`` share, and their argument parser.

One table for both commands, so a script reads a status the same whichever it
ran (the README lists it).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

#: Everything in order.
EXIT_OK = 0
#: The work ran and failed: a bench engine failed, the runs' tokens differ, or no layout
#: fits (``plan``).
EXIT_FAILED = 1
#: A setting or an argument is wrong (a plugin setting, VLLM_PLUGINS, a flag).
EXIT_MISCONFIGURED = 2
#: No NVIDIA GPU is visible, or fewer than the runs need.
EXIT_NO_GPU = 3
#: torch, torchvision or vLLM is installed but does not import (or lacks what the plugin reads).
EXIT_BROKEN_INSTALL = 4
#: The installed vLLM is outside the supported range (and no override is set).
EXIT_UNSUPPORTED = 5

TABLE = (
    f"Exit status: {EXIT_OK} in order, {EXIT_FAILED} a run failed or tokens differ (bench) "
    f"or no layout fits (plan), "
    f"{EXIT_MISCONFIGURED} a setting or argument is wrong, {EXIT_NO_GPU} no GPU or too "
    f"few visible, {EXIT_BROKEN_INSTALL} torch, torchvision or vLLM does not import, "
    f"{EXIT_UNSUPPORTED} unsupported vLLM."
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a wrong argument reported in one line instead of after the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_MISCONFIGURED,
                  f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
