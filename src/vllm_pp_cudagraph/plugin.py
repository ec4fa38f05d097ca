"""vLLM general-plugin entry point (``vllm.general_plugins``: ``pp_cudagraph``), called in every
process vLLM starts; inert unless ``VLLM_PLUGINS`` names it; imports vLLM internals only then."""

from __future__ import annotations

import sys
from collections.abc import Mapping

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.settings import (PLUGIN_NAME, PluginConfigError,
                                               PPCudaGraphSettings, SettingsError,
                                               environment_value, is_enabled)

_inactive_logged = False


def _logger():
    """vLLM's own logger, imported late so that ``check`` runs without vLLM."""
    from vllm.logger import init_logger

    return init_logger("vllm.pp_cudagraph")


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is outside the range this plugin is tested with."""


def check_version(allow_unsupported: bool) -> vllm_surface.VersionInfo:
    versions = vllm_surface.installed_versions()
    if versions.supported:
        return versions
    if allow_unsupported:
        _logger().warning("vllm-pp-cudagraph is tested with vLLM %s but vLLM %s is installed; "
                          "continuing because VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM is set.",
                          vllm_surface.SUPPORTED_RANGE, versions.vllm)
        return versions
    raise UnsupportedVLLMError(
        f"vllm-pp-cudagraph supports vLLM {vllm_surface.SUPPORTED_RANGE}, but vLLM "
        f"{versions.vllm or '(not installed)'} is installed. Install a supported "
        "vLLM, remove pp_cudagraph from VLLM_PLUGINS, or set "
        "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 to try it anyway.")


def check_runner_choice(environ: Mapping[str, str] | None = None) -> None:
    """Refuse an explicit choice of vLLM's V1 runner, under which the plugin would do nothing."""
    current = environment_value("VLLM_USE_V2_MODEL_RUNNER", environ)
    # vLLM parses this variable with bool(int(value)): "0" is its only "off".
    if current is not None and current.strip() == "0":
        raise PluginConfigError(
            "VLLM_PLUGINS enables pp_cudagraph, which runs on vLLM's Model Runner "
            f"V2, but VLLM_USE_V2_MODEL_RUNNER={current!r} selects the V1 runner. "
            "Unset VLLM_USE_V2_MODEL_RUNNER (or set it to 1), or remove "
            "pp_cudagraph from VLLM_PLUGINS to run stock vLLM.")


def report_without_traceback(*errors: type[BaseException]) -> None:
    """Print uncaught ``errors`` as one line on stderr: a traceback through vLLM's argument
    parser would bury the line that says which setting to change."""
    previous = sys.excepthook
    if getattr(previous, "reports_without_traceback", ()) == errors:
        return

    def hook(kind, value, traceback):
        if issubclass(kind, errors):
            print(f"vllm-pp-cudagraph: {value}", file=sys.stderr)
        else:
            previous(kind, value, traceback)

    hook.reports_without_traceback = errors  # type: ignore[attr-defined]
    sys.excepthook = hook


def register() -> None:
    """Entry point vLLM calls; re-entrant and inert unless enabled."""
    global _inactive_logged
    if not is_enabled():
        if not _inactive_logged:
            _inactive_logged = True
            _logger().info("vllm-pp-cudagraph is installed but inactive; set VLLM_PLUGINS=%s "
                           "to use its pipeline-parallel CUDA graphs.", PLUGIN_NAME)
        return
    from vllm_pp_cudagraph.shared.snapshots import ensure_metrics_dir

    report_without_traceback(SettingsError, PluginConfigError, UnsupportedVLLMError)
    settings = PPCudaGraphSettings.current()
    check_version(settings.allow_unsupported_vllm)
    check_runner_choice()
    # Before the engine's processes start, so they inherit it (plans, heartbeats, metrics).
    ensure_metrics_dir()
    from vllm_pp_cudagraph import patches

    patches.enter_process(patches.processes_here(), settings)
