"""What the plugin has proven on GPUs (``proven.json``), and engines it stands aside for."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph.shared import vllm_surface

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_PROVEN = json.loads(Path(__file__).with_name("proven.json").read_text())


@dataclass(frozen=True)
class Proven:
    """A feature the plugin has run with on GPUs, on these releases, with this evidence."""

    releases: tuple[str, ...]
    evidence: str


def _features(kind: str) -> dict[str, Proven]:
    return {name: Proven(tuple(entry["releases"]), entry["evidence"])
            for name, entry in _PROVEN[kind].items()}


#: Speculative methods (vLLM's ``speculative_config.method``) proven with the plugin.
PROVEN_SPECULATIVE: dict[str, Proven] = _features("speculative")
PROVEN_CONNECTORS: dict[str, Proven] = _features("connectors")
#: Per release run on GPUs: what ran, the torch it ran with, and the layouts.
_RELEASES = _PROVEN["releases"].items()
GPU_EVIDENCE: dict[str, str] = {r: e["evidence"] for r, e in _RELEASES}
GPU_TORCH: dict[str, str] = {r: e["torch"] for r, e in _RELEASES}
PROVEN_LAYOUTS: dict[str, tuple[str, ...]] = {r: tuple(e["layouts"]) for r, e in _RELEASES}
#: Attention backends token-checked with the KV-cache write inside piecewise graphs.
KV_UPDATE_PROVEN_BACKENDS = frozenset(_PROVEN["kv_update_in_graphs_backends"])
#: Releases where stock vLLM fails speculative decoding under PP, async scheduling off.
SPECULATIVE_SYNC_PP_FAILS: dict[str, str] = dict(_PROVEN["stock_fails"]["speculative_sync_pp"])
#: Releases where stock vLLM cannot load an EAGLE-1 draft whose layer index clashes.
EAGLE_DRAFT_NAME_CLASH: dict[str, str] = dict(_PROVEN["stock_fails"]["eagle_draft_name_clash"])
#: How every line saying the plugin leaves an engine to stock vLLM begins (bench counts).
STAND_ASIDE = "vllm-pp-cudagraph stands aside for this engine"


class KnownStockFailureError(ValueError):
    """An engine stock vLLM is known to fail on this release, refused at start."""


@functools.cache
def release_line() -> str | None:
    """The installed vLLM's ``major.minor``, as the table keys releases."""
    return _major_minor(vllm_surface.installed_versions().vllm)


def _major_minor(version: str | None) -> str | None:
    release = vllm_surface.parse_release(version or "")
    return f"{release[0]}.{release[1]}" if release else None


def _unproven(kind: str, name: str, table: dict[str, Proven]) -> str | None:
    proven, here = table.get(name), release_line()
    if proven is not None and here in proven.releases:
        return None
    where = (f"proven on vLLM {', '.join(proven.releases)} only, not {here}"
             if proven else "not yet run on a GPU with the plugin")
    return f"{kind} {name!r} is {where}"


def no_pipeline_reason(pp: int) -> str | None:
    """Why the plugin has nothing to do for an engine of ``pp`` stages, or None."""
    return None if pp > 1 else (
        "no pipeline (PP=1): the plugin only changes pipeline-parallel engines")


def drafting(vllm_config: VllmConfig) -> Any | None:
    """The engine's speculative config, or None where it drafts no tokens."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or not getattr(speculative, "num_speculative_tokens", 1):
        return None
    return speculative


def known_failure(pp: int, speculative: str | None, async_scheduling: bool | None,
                  num_layers: int, layers: tuple[int, ...] | None = None) -> str | None:
    """Why stock vLLM of this release fails an engine drafting with ``speculative`` (None: no
    drafts) under split ``layers`` (None: vLLM's), with what to change; None where it works."""
    if pp < 2 or speculative is None:
        return None
    if async_scheduling is False and (how := SPECULATIVE_SYNC_PP_FAILS.get(release_line())):
        return (f"speculative decoding under pipeline parallelism with async scheduling "
                f"off: {how}. Turn async scheduling back on (drop --no-async-scheduling / "
                "async_scheduling=False), or serve without speculative_config")
    if speculative == "eagle" and (how := EAGLE_DRAFT_NAME_CLASH.get(release_line())):
        if (clash := eagle_draft_layer_clash(pp, num_layers, layers)) is not None:
            return (f"an EAGLE draft under pipeline parallelism: {how} (here "
                    f"model.layers.{clash}). Serve without the draft, or with an EAGLE3 "
                    "draft, which vLLM numbers past the model's layers")
    return None


def eagle_draft_layer_clash(pp: int, num_layers: int, layers: tuple[int, ...] | None = None
                            ) -> int | None:
    """The index an EAGLE-1 draft takes on the last stage (of ``layers``, else vLLM's split)
    where that stage already holds it, else None."""
    from vllm.distributed.utils import get_pp_indices
    start, end = ((num_layers - layers[-1], num_layers) if layers
                  else get_pp_indices(num_layers, pp - 1, pp))
    return end - start if start <= end - start < end else None


def unproven_reason(speculative: str | None, connector: str | None,
                    allow_unproven: bool = False) -> str | None:
    """Why the plugin leaves a PP engine to stock vLLM for a ``speculative`` method or KV
    ``connector`` not proven with it here (unless ``allow_unproven``), or None."""
    if allow_unproven:
        return None
    return ((speculative and _unproven("speculative method", speculative, PROVEN_SPECULATIVE))
            or (connector and _unproven("KV connector", connector, PROVEN_CONNECTORS)) or None)
