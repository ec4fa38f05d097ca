"""Adds each served run's TTFT p50 to the check's cells: from the run's own record in
its results folder (bench.json or a lane's), matched on the req/s the cell took from it.

    python benchmarks/results/2026-11-27-plan-check-ttft-cpu/add_ttft.py \
        benchmarks/results/2026-11-27-plan-check-with-32b-cost-table-cpu/cells.json \
        > benchmarks/results/2026-11-27-plan-check-ttft-cpu/cells.json
"""

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1]


def recorded_runs(folder: str) -> list[dict]:
    runs = []
    for path in sorted((RESULTS / folder).rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("runs"), list):
            runs += [r for r in record["runs"] if isinstance(r, dict) and r.get("req_per_s")]
    return runs


cells = json.loads(Path(sys.argv[1]).read_text())
for cell in cells:
    if cell["workload"] != "serve":
        continue
    matches = [r for r in recorded_runs(cell["folder"])
               if abs(r["req_per_s"] - cell["req_per_s"]) < 0.006 and r.get("ttft_p50_ms")]
    if matches:
        cell["ttft_p50_ms"] = round(matches[0]["ttft_p50_ms"], 1)
print(json.dumps(cells, indent=1))
