"""The proven table ``check`` prints: what ran on GPUs with the plugin on this release."""

from __future__ import annotations

from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.shared.support import (
    EAGLE_DRAFT_NAME_CLASH,
    GPU_EVIDENCE,
    GPU_TORCH,
    KV_UPDATE_PROVEN_BACKENDS,
    PROVEN_CONNECTORS,
    PROVEN_LAYOUTS,
    PROVEN_SPECULATIVE,
    SPECULATIVE_SYNC_PP_FAILS,
    _major_minor,
    release_line,
)
from vllm_pp_cudagraph.worker.graphs.graph_agreement import CAPTURE_FAILED_ADVICE


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
