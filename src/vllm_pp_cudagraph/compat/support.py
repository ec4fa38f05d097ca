"""What the plugin has proven on GPUs, and the engines it stands aside for.

The tables ``check`` prints; docs/architecture.md and docs/deployments.md say why and
what each entry covers."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_pp_cudagraph import compat
from vllm_pp_cudagraph.worker.graphs.graph_agreement import CAPTURE_FAILED_ADVICE
from vllm_pp_cudagraph.worker.graphs.piecewise_split import KV_UPDATE_PROVEN_BACKENDS

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class Proven:
    """A feature the plugin has run with on GPUs, on these releases, with this evidence."""

    releases: tuple[str, ...]
    evidence: str


#: Speculative methods (vLLM's ``speculative_config.method``) proven with the plugin.
PROVEN_SPECULATIVE: dict[str, Proven] = {
    "ngram": Proven(("0.33",), "PP=2, both stages on one H200, async scheduling on: tokens "
                    "and acceptance equal two stock engines' (results 2026-11-24, "
                    "spec-decode-layouts)"),
    "eagle3": Proven(("0.33",), "PP=2, both stages on one H200, async scheduling on, random "
                     "one-layer draft: tokens and drafts equal two stock engines' (results "
                     "2026-11-24 and 2026-11-25, shared-gpu-layouts-decided)"),
}

#: Releases the plugin has run on GPUs, and what ran; the others pass its CPU suite only.
GPU_EVIDENCE: dict[str, str] = {
    "0.26": "GPU-proven: PP=2 with a GPU per stage, every graph mode, soaks, the GPU tests",
    "0.33": "GPU-proven: with a GPU per rank, PP=2 in every graph mode (served, soaked "
            "and faulted too), PP=3, PP=4, TP=2 x PP=2 and EAGLE3; with stages sharing "
            "one GPU, every GPU test and more splits",
}

#: The torch release every GPU run of the plugin used, per vLLM release.
GPU_TORCH: dict[str, str] = {"0.26": "2.11", "0.33": "2.11"}

#: Layouts and backends run on GPUs, by release ("shared GPU": one GPU, correctness only).
PROVEN_LAYOUTS: dict[str, tuple[str, ...]] = {
    "0.26": ("PP=2, TP=1, every graph mode, TRITON_ATTN (a GPU per stage)",),
    "0.33": ("PP=2, TP=1, every graph mode, TRITON_ATTN and FLASH_ATTN (shared GPU; "
             "vLLM's own backend with a GPU per stage); FLASHINFER in FULL_AND_PIECEWISE "
             "(shared GPU)",
             "PP=3, vLLM's split and 10/10/8, every graph mode (shared GPU; 10/10/8 "
             "from VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto in FULL_AND_PIECEWISE with a "
             "GPU per stage)",
             "PP=4, vLLM's split (7/7/7/7), 8/8/7/5 and 8/7/7/6, every graph mode "
             "(shared GPU; vLLM's split in FULL_AND_PIECEWISE and eager with a GPU per "
             "stage)",
             "TP=2 x PP=2, FULL_AND_PIECEWISE (a GPU per rank) and eager (shared GPU)",
             "VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto at PP=2 and PP=3, FULL_AND_PIECEWISE "
             "(shared GPU; PP=3 with a GPU per stage)"),
}

#: KV connectors proven with the plugin.
PROVEN_CONNECTORS: dict[str, Proven] = {
    "ExampleConnector": Proven(("0.33",), "PP=2, both stages on one H200: one engine "
                               "stored every prompt's KV cache, a second loaded it, both "
                               "with a stock engine's tokens without the connector, or "
                               "near ties (results 2026-11-25, shared-gpu-layouts-decided)"),
}

#: Releases where stock vLLM fails speculative decoding under PP, async scheduling off.
SPECULATIVE_SYNC_PP_FAILS: dict[str, str] = {
    "0.33": "stock vLLM 0.33.0 fails on its first step (an assertion in the first "
            "stage's prepare_inputs, then a 5-minute RPC timeout), ngram and EAGLE3 alike",
}


#: Releases where stock vLLM cannot load an EAGLE-1 draft whose layer index clashes.
EAGLE_DRAFT_NAME_CLASH: dict[str, str] = {
    "0.33": "stock vLLM 0.33.0 fails to load the draft on the last stage: it names the "
            "draft's layer after that stage's layer count, a name the stage's own layers "
            "already hold ('Duplicate layer name')",
}


#: How every line saying the plugin leaves an engine to stock vLLM begins (bench counts).
STAND_ASIDE = "vllm-pp-cudagraph stands aside for this engine"


class KnownStockFailureError(ValueError):
    """An engine stock vLLM is known to fail on this release, refused at start."""


@functools.cache
def release_line() -> str | None:
    """The installed vLLM's ``major.minor``, as the table keys releases."""
    return _major_minor(compat.installed_versions().vllm)


def _major_minor(version: str | None) -> str | None:
    release = compat.parse_release(version or "")
    return f"{release[0]}.{release[1]}" if release else None


def _unproven(kind: str, name: str, table: dict[str, Proven]) -> str | None:
    proven = table.get(name)
    here = release_line()
    if proven is not None and here in proven.releases:
        return None
    where = (f"proven on vLLM {', '.join(proven.releases)} only, not {here}"
             if proven else "not yet run on a GPU with the plugin")
    return f"{kind} {name!r} is {where}"


def gpu_evidence(vllm_version: str) -> str:
    """Whether the plugin has run on GPUs on ``vllm_version``'s release, and what."""
    return GPU_EVIDENCE.get(_major_minor(vllm_version),
                            "never run on a GPU with the plugin (CPU suite only)")


def torch_evidence(vllm_version: str | None, torch_version: str | None) -> str:
    """Whether the plugin's GPU runs on this vLLM used this torch release."""
    proven = GPU_TORCH.get(_major_minor(vllm_version))
    here = _major_minor(torch_version)
    if proven is None or here is None:
        return ""
    if here == proven:
        return f"the torch of the GPU runs on vLLM {_major_minor(vllm_version)}"
    return (f"GPU runs on vLLM {_major_minor(vllm_version)} used torch {proven}; with "
            f"{here} only the CPU suite has run (docs/deployments.md, Versions)")


def no_pipeline_reason(pp: int) -> str | None:
    """Why the plugin has nothing to do for an engine of ``pp`` stages, or None."""
    if pp > 1:
        return None
    return "no pipeline (PP=1): the plugin only changes pipeline-parallel engines"


def drafting(vllm_config: VllmConfig) -> Any | None:
    """The engine's speculative config, or None where it drafts no tokens: the one test
    of speculative decoding the plan's facts take."""
    speculative = getattr(vllm_config, "speculative_config", None)
    if speculative is None or not getattr(speculative, "num_speculative_tokens", 1):
        return None
    return speculative


def known_failure(pp: int, speculative: str | None, async_scheduling: bool | None,
                  num_layers: int, layers: tuple[int, ...] | None = None) -> str | None:
    """Why stock vLLM of this release fails an engine of ``pp`` stages drafting with the
    ``speculative`` method (None: no drafts; "": a method vLLM did not name), with what to
    change, or None; ``layers`` is the split the engine will use, where known (else vLLM's)."""
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
    """The layer index an EAGLE-1 draft would take on the last of ``pp`` stages, where that
    stage already holds it, else None; under ``layers`` per stage, or vLLM's split."""
    from vllm.distributed.utils import get_pp_indices

    start, end = ((num_layers - layers[-1], num_layers) if layers
                  else get_pp_indices(num_layers, pp - 1, pp))
    return end - start if start <= end - start < end else None


def unproven_reason(speculative: str | None, connector: str | None,
                    allow_unproven: bool = False) -> str | None:
    """Why the plugin leaves a PP engine drafting with the ``speculative`` method or moving
    KV through ``connector`` to stock vLLM: one not proven with it here (``allow_unproven``
    runs it regardless), or None."""
    if allow_unproven:
        return None
    if speculative and (reason := _unproven("speculative method", speculative,
                                            PROVEN_SPECULATIVE)):
        return reason
    if connector and (reason := _unproven("KV connector", connector, PROVEN_CONNECTORS)):
        return reason
    return None


def table_lines() -> list[str]:
    """One line per proven layout and feature, and what stands aside, for ``check``."""
    here = release_line()
    layouts = PROVEN_LAYOUTS.get(here, ())
    lines = [f"layout: {layout}" for layout in layouts] or [
        f"layout: none run on a GPU with the plugin on vLLM {here}"]
    lines.append("layout: the others run with the plugin, unproven (other splits at "
                 "PP=4, PP above 4, other TP x PP shapes, PP across hosts; "
                 "docs/deployments.md)")
    lines.append("attention backend: the KV-cache write stays inside piecewise graphs with "
                 f"{', '.join(sorted(KV_UPDATE_PROVEN_BACKENDS))} (or vLLM's own choice); "
                 "another backend asked for by name keeps vLLM's split")
    lines.append("CUDA-graph capture failing on any rank: every stage runs eagerly, and each "
                 "logs which stage (and TP rank) failed and why. "
                 f"{CAPTURE_FAILED_ADVICE}")
    for what, table in (("speculative decoding under PP with async scheduling off",
                         SPECULATIVE_SYNC_PP_FAILS),
                        ("an EAGLE (EAGLE-1) draft under PP, last stage holding half the "
                         "layers or more", EAGLE_DRAFT_NAME_CLASH)):
        for release, how in table.items():
            state = "refused at start here" if release == here else "not refused here"
            lines.append(f"{what}: {state} (vLLM {release}: {how})")
    for kind, table in (("speculative method", PROVEN_SPECULATIVE),
                        ("KV connector", PROVEN_CONNECTORS)):
        for name, proven in table.items():
            state = "runs with the plugin" if here in proven.releases else "stands aside here"
            lines.append(f"{kind} {name}: {state} (proven on vLLM "
                         f"{', '.join(proven.releases)}: {proven.evidence})")
        others = "every other" if table else "every"
        lines.append(f"{kind}: {others} one stands aside (stock runner and cadence) unless "
                     "VLLM_PP_CUDAGRAPH_ALLOW_UNPROVEN=1")
    return lines
