"""The cells measured with a GPU per stage that ``plan`` puts beside its predictions
(``measured_cells.json``: each names its results folder), and the model's measured error."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from vllm_pp_cudagraph.commands.planning.pipeline_model import Workload
from vllm_pp_cudagraph.shared.stage_costs import ModelShape

CELLS_FILE = Path(__file__).with_name("measured_cells.json")


@dataclass(frozen=True)
class MeasuredCell:
    """One committed cell: its load, where it ran, each layout's req/s, and the layout
    that won by more than its passes' spread (None where they were level)."""

    shape: str
    gpus: int
    interconnect: str
    workload: str
    load: int
    input_len: int
    output_len: int
    max_num_seqs: int
    gpu: str
    vllm: str
    req_per_s: dict[str, float]
    winner: str | None
    how: str
    source: str
    host_bound: bool = False
    """Whether the API server and the client, not the GPUs, set the cell's pace."""
    api_servers: int = 1
    """``vllm serve --api-server-count`` of the cell's servers."""

    def line(self) -> str:
        figures = ", ".join(f"{layout} {value:.2f}" for layout, value in self.req_per_s.items())
        verdict = f"{self.winner} won" if self.winner else "level within its spread"
        return (f"measured on {self.gpu}, vLLM {self.vllm}, {self.workload}: {figures} req/s; "
                f"{verdict} ({self.how}; {self.source})")


@cache
def _table() -> dict[str, Any]:
    return json.loads(CELLS_FILE.read_text())


def median_error() -> float:
    """How far the model's req/s was off at the median on the measured runs."""
    return float(_table()["median_error"])


def error_class(workload: str, host_paced: bool) -> str:
    """The class of rows whose errors are pooled: the workload, and whether the host paced
    the predicted steps (the model's host time is an offline fit, its GPU time a table)."""
    return f"{workload}, host-paced" if host_paced else workload


def row_error(kind: str, workload: str, host_paced: bool = False) -> float:
    """How far the model was off at the median for rows of ``kind`` (``plugin``, ``stock``
    or ``tp``) under ``workload`` (``engine`` or ``serve``), paced as ``host_paced`` says,
    on the measured runs. A host-paced row of a kind none was measured like takes the
    largest error of the kinds that were (the host time is one term for every layout);
    else the kind's error under ``workload``, or the overall median where none was."""
    errors = _table().get("errors", {})
    wanted = error_class(workload, host_paced)
    if wanted in errors.get(kind, {}):
        return float(errors[kind][wanted])
    if host_paced and (paced_alike := [by[wanted] for by in errors.values() if wanted in by]):
        return float(max(paced_alike))
    return float(errors.get(kind, {}).get(workload, median_error()))


def cells() -> list[MeasuredCell]:
    return [MeasuredCell(**cell) for cell in _table()["cells"]]


def host_bound_output(api_servers: int = 1) -> tuple[float, MeasuredCell] | None:
    """The most output tokens/s a server with ``api_servers`` API servers put out in a cell
    its host bound (the model has no term for the API server or the client), and that cell;
    None where none was."""
    found = [(max(cell.req_per_s.values()) * cell.output_len, cell)
             for cell in cells() if cell.workload == "serve" and cell.host_bound
             and cell.api_servers == api_servers]
    return max(found, key=lambda f: f[0], default=None)


def matching(shape: ModelShape, gpus: int, work: Workload, interconnect: str,
             shape_of: Callable[[str], ModelShape]) -> list[MeasuredCell]:
    """The measured cells that are this question: the same model shape, GPUs, link and
    load (``work.prompts`` for ``engine``, its concurrency for ``serve``)."""
    load = work.prompts or work.concurrency
    return [cell for cell in cells()
            if (cell.gpus, cell.interconnect, cell.workload, cell.load, cell.input_len,
                cell.output_len, cell.max_num_seqs, cell.api_servers)
            == (gpus, interconnect, work.kind, load, work.input_len, work.output_len,
                work.max_num_seqs, work.api_servers)
            and shape_of(cell.shape) == shape]


@dataclass(frozen=True)
class StockCalibration:
    """Stock PP's GPU time per step over the plugin's for one release and workload, from
    committed cells with a GPU per stage."""

    vllm: str
    workload: str
    factor: float
    how: str
    source: str


def stock_calibration(vllm_version: str | None, workload: str) -> StockCalibration:
    """The calibration for ``workload`` of the newest calibrated release at or below the
    installed one (the oldest where none is), its engine row where it has no ``workload``
    row."""
    rows = [StockCalibration(**row) for row in _table()["stock_pp"]]
    releases = sorted({row.vllm for row in rows}, key=_minor)
    installed = _minor(vllm_version or releases[-1])
    at_or_below = [r for r in releases if _minor(r) <= installed] or releases[:1]
    release = at_or_below[-1]
    for want in (workload, "engine"):
        if found := [row for row in rows if (row.vllm, row.workload) == (release, want)]:
            return found[0]
    raise ValueError(f"no stock calibration for vLLM {release}")


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = (version.split("+")[0].split(".") + ["0", "0"])
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
