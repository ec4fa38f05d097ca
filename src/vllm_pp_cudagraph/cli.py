"""``vllm-pp-cudagraph`` command line."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from importlib import metadata

from vllm_pp_cudagraph import __version__, compat
from vllm_pp_cudagraph.plugin import PLUGIN_NAME, is_enabled
from vllm_pp_cudagraph.settings import PPCudaGraphSettings, SettingsError

EXIT_OK = 0
EXIT_UNSUPPORTED = 1
EXIT_MISCONFIGURED = 2


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


def _gpu_count() -> str:
    try:
        import torch
    except ImportError:
        return "unknown (torch is not installed)"
    return str(torch.cuda.device_count())


def check(out=sys.stdout) -> int:
    """Report whether this install can run the plugin; return the exit code."""
    code = EXIT_OK

    def say(line: str = "") -> None:
        print(line, file=out)

    versions = compat.installed_versions()
    say(f"vllm-pp-cudagraph {__version__}")
    if not versions.installed:
        say(f"vLLM: not installed (supported: {compat.SUPPORTED_RANGE})  UNSUPPORTED")
        code = EXIT_UNSUPPORTED
    elif versions.supported:
        say(f"vLLM: {versions.vllm} (supported: {compat.SUPPORTED_RANGE})  OK")
    else:
        say(
            f"vLLM: {versions.vllm} (supported: {compat.SUPPORTED_RANGE})  UNSUPPORTED: "
            "install a supported vLLM, or set VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 "
            "to try anyway"
        )
        code = EXIT_UNSUPPORTED
    say(f"torch: {versions.torch or 'not installed'}")

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
                f"  WARNING: {miss!r} is not the plugin's name; did you mean "
                f"{PLUGIN_NAME!r}? vLLM splits VLLM_PLUGINS on ',' and matches "
                "names exactly (no spaces)."
            )
    others = [name for name in _general_plugins() if name != PLUGIN_NAME]
    say(
        "  note: VLLM_PLUGINS also filters every other vLLM plugin: only the names "
        "it lists are loaded."
        + (f" Other installed general plugins: {', '.join(others)}." if others else "")
    )

    try:
        settings = PPCudaGraphSettings.from_env()
        say("settings: OK")
        for name, value in settings.model_dump().items():
            say(f"  {PPCudaGraphSettings.env_name(name)}={value}")
    except SettingsError as exc:
        say(f"settings: INVALID: {exc}")
        code = max(code, EXIT_MISCONFIGURED)

    if versions.installed:
        from vllm_pp_cudagraph.patches import PATCHES, SCOPED_PATCHES

        say("patches applied when enabled:")
        for patch in PATCHES:
            say(f"  - {patch.name}: {patch.target}")
        for scoped in SCOPED_PATCHES:
            say(f"  - {scoped.name} (during graph capture only): {scoped.target}")
        v2_env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
        if is_enabled() and v2_env is not None and v2_env.strip() == "0":
            say(
                "  ERROR: VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner, which the "
                "plugin cannot serve; unset it or remove pp_cudagraph from VLLM_PLUGINS."
            )
            code = max(code, EXIT_MISCONFIGURED)

    say(f"GPUs visible: {_gpu_count()}")
    return code


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
        help="Report versions, whether the plugin is enabled, and what it patches.",
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
