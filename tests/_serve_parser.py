"""`vllm serve`'s own argument parser, for checking the command lines the tooling builds."""

from __future__ import annotations

import argparse
import importlib

from vllm.utils.argparse_utils import FlexibleArgumentParser


def _make_arg_parser():
    """``make_arg_parser``: in entrypoints.openai up to 0.28, entrypoints.launchers in
    0.29-0.32, entrypoints.common from 0.33."""
    for place in ("openai", "launchers", "common"):
        try:
            return importlib.import_module(f"vllm.entrypoints.{place}.cli_args").make_arg_parser
        except ImportError:
            continue
    raise ImportError("no vllm.entrypoints.*.cli_args.make_arg_parser in this vLLM")


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """What ``vllm serve`` makes of ``argv`` (everything after ``serve``)."""
    return _make_arg_parser()(FlexibleArgumentParser()).parse_args(argv)
