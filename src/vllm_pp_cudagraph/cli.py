"""``vllm-pp-cudagraph`` command line."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
from collections.abc import Iterator
from importlib import metadata

from vllm_pp_cudagraph import __version__, compat, install_check
from vllm_pp_cudagraph.plugin import PLUGIN_NAME, check_runner_choice, is_enabled
from vllm_pp_cudagraph.settings import PPCudaGraphSettings, SettingsError

EXIT_OK = 0
#: The installed vLLM is outside the supported range (and no override is set).
EXIT_UNSUPPORTED = 1
#: A setting is wrong: a plugin setting, a misspelt VLLM_PLUGINS, V1 forced with the plugin.
EXIT_MISCONFIGURED = 2
#: Everything is in order except that no NVIDIA GPU is visible.
EXIT_NO_GPU = 3
#: torch, torchvision or vLLM is installed but does not import (or lacks what the plugin reads).
EXIT_BROKEN_INSTALL = 4


def _near_misses(value: str) -> list[str]:
    """Entries of VLLM_PLUGINS that look like a mistyped plugin name."""
    misses = []
    for entry in value.split(","):
        if entry == PLUGIN_NAME:
            continue
        normalized = entry.strip().lower().replace("-", "_")
        if normalized == PLUGIN_NAME or difflib.get_close_matches(
            normalized, [PLUGIN_NAME], n=1, cutoff=0.75
        ):
            misses.append(entry)
    return misses


def _general_plugins() -> list[str]:
    return sorted(ep.name for ep in metadata.entry_points(group="vllm.general_plugins"))


def _gpu_count() -> int | None:
    """GPUs torch sees; None where torch is not installed or does not import."""
    try:
        import torch
    except Exception:  # a broken torch build raises more than ImportError
        return None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@contextlib.contextmanager
def _vllm_logs_to_stderr() -> Iterator[None]:
    """vLLM logs to stdout; while it is first imported, point its handler at stderr.

    vLLM reads ``VLLM_LOGGING_STREAM`` once, when its logger is set up on
    first import, so its later lines (from the probes behind the patch list)
    go to stderr too and the report on stdout stays whole.
    """
    before = os.environ.get("VLLM_LOGGING_STREAM")
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_LOGGING_STREAM", None)
        else:
            os.environ["VLLM_LOGGING_STREAM"] = before


def check(out=sys.stdout) -> int:
    """Report whether this install can run the plugin; return the exit code.

    The code is that of the first problem found, in this order: the vLLM
    version (1), an install that does not import (4), settings (2), no GPU
    visible (3); 0 when there is none.
    """
    problems: list[int] = []

    def say(line: str = "") -> None:
        print(line, file=out)

    settings = None
    settings_error = None
    try:
        settings = PPCudaGraphSettings.from_env()
    except SettingsError as exc:
        settings_error = exc

    versions = compat.installed_versions()
    say(f"vllm-pp-cudagraph {__version__}")
    if not versions.installed:
        say(f"vLLM: not installed (supported: {compat.SUPPORTED_RANGE})  UNSUPPORTED")
        problems.append(EXIT_UNSUPPORTED)
    elif versions.supported:
        say(f"vLLM: {versions.vllm} (supported: {compat.SUPPORTED_RANGE})  OK")
    elif settings is not None and settings.allow_unsupported_vllm:
        say(
            f"vLLM: {versions.vllm} (supported: {compat.SUPPORTED_RANGE})  UNSUPPORTED, "
            "allowed by VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 (untested: the plugin's "
            "overrides may not match this vLLM)"
        )
    else:
        say(
            f"vLLM: {versions.vllm} (supported: {compat.SUPPORTED_RANGE})  UNSUPPORTED: "
            "install a supported vLLM, or set VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 "
            "to try anyway"
        )
        problems.append(EXIT_UNSUPPORTED)
    say(f"torch: {versions.torch or 'not installed'}")
    broken = None
    if versions.installed:
        with _vllm_logs_to_stderr():
            broken = install_check.import_failure()
        if broken is None:
            say("imports: OK")
        else:
            say(f"imports: BROKEN: {broken.message()}")
            problems.append(EXIT_BROKEN_INSTALL)

    plugins_value = os.environ.get("VLLM_PLUGINS")
    if is_enabled():
        say(f"VLLM_PLUGINS={plugins_value!r}: plugin ENABLED")
    elif plugins_value is None:
        say(
            "VLLM_PLUGINS is unset: plugin INACTIVE (vLLM loads it, and it stays "
            f"inert). Set VLLM_PLUGINS={PLUGIN_NAME} to enable it."
        )
    else:
        say(f"VLLM_PLUGINS={plugins_value!r}: plugin INACTIVE")
        for miss in _near_misses(plugins_value):
            say(
                f"  ERROR: {miss!r} is not the plugin's name; did you mean "
                f"{PLUGIN_NAME!r}? vLLM splits VLLM_PLUGINS on ',' and matches "
                "names exactly (no spaces)."
            )
            problems.append(EXIT_MISCONFIGURED)
    others = [name for name in _general_plugins() if name != PLUGIN_NAME]
    say(
        "  note: VLLM_PLUGINS also filters every other vLLM plugin: only the names "
        "it lists are loaded."
        + (f" Other installed general plugins: {', '.join(others)}." if others else "")
    )

    if settings_error is not None:
        say(f"settings: INVALID: {settings_error}")
        problems.append(EXIT_MISCONFIGURED)
    else:
        say("settings: OK")
        for name, value in settings.model_dump().items():
            say(f"  {PPCudaGraphSettings.env_name(name)}={value}")

    if broken is not None:
        say("patches: not listed (vLLM does not import, see above)")
    elif versions.installed and settings is not None:
        from vllm_pp_cudagraph.patches import PATCHES, standing
        from vllm_pp_cudagraph.settings import PluginConfigError

        try:
            rows = standing(settings)
        except Exception as exc:  # a vLLM whose internals differ from SURFACE's
            rows = []
            missing = compat.missing_surface()
            say(f"patches: could not be listed: {install_check.describe(exc)}"
                + (f". Missing from this vLLM: {'; '.join(missing)}" if missing else ""))
            problems.append(EXIT_BROKEN_INSTALL)
        else:
            say("patches when enabled, on this vLLM with these settings:")
        for patch, why in rows:
            state = "applies" if why is None else f"stands aside: {why}"
            say(f"  - {patch.name}: {state}  [{patch.target}]")
        for scoped in [p for p in PATCHES if p.scope] if rows else ():
            say(f"  - {scoped.name}: applied later by {scoped.scope}  [{scoped.target}]")
        if is_enabled():
            try:
                check_runner_choice()
            except PluginConfigError as exc:
                say(f"  ERROR: {exc}")
                problems.append(EXIT_MISCONFIGURED)

    gpus = _gpu_count()
    if gpus is None:
        say("GPUs visible: unknown (torch is not installed or does not import)")
    elif gpus == 0:
        say("GPUs visible: 0  PROBLEM: no NVIDIA GPU visible; vLLM cannot serve here "
            "(check the driver and CUDA_VISIBLE_DEVICES)")
        problems.append(EXIT_NO_GPU)
    else:
        say(f"GPUs visible: {gpus}")
    return problems[0] if problems else EXIT_OK


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from vllm_pp_cudagraph.bench import cli as bench

        return bench.main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="vllm-pp-cudagraph",
        description="Pipeline-parallel CUDA graphs for vLLM Model Runner V2.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "check",
        help="Report versions, whether torch and vLLM import, whether the plugin is "
        "enabled, which patches apply or stand aside, and GPUs visible. Exit codes: 0 ok, "
        "1 unsupported vLLM, 2 misconfigured, 3 no GPU visible, 4 torch, torchvision or "
        "vLLM does not import.",
    )
    sub.add_parser(
        "bench",
        help="Throughput and latency per CUDA-graph mode at PP, plugin vs stock "
        "(see 'bench --help').",
    )
    parser.parse_args(argv)  # "check" is the only command parsed here
    return check()


if __name__ == "__main__":
    sys.exit(main())
