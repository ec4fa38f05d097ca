"""Pair the runs of two bench lanes served side by side (``bench --lane-sync``; DIR/lane-a, -b):
per pair of runners, the ratios of each slot and each pass pair, and their medians (lanes.md)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any


def point_of(run: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Input length, concurrency and arrival rate (None: a closed loop) of a served run."""
    return run.get("input_len"), run.get("concurrency"), run["spec"].get("request_rate")


def point_label(input_len: Any, concurrency: Any, rate: Any) -> str:
    if rate is None:
        return f"{input_len} in x c{concurrency}"
    return f"{input_len} in at {rate:g}/s (c{concurrency} at most)"


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of one run."""
    engine = run.get("engine_metrics") or {}
    stages = run.get("stage_metrics") or {}
    graphs = sum(s["graph_steps_total"] for s in stages.values())
    eager = sum(s["eager_steps_total"] for s in stages.values())
    return {
        "runner": run["spec"]["runner"], "req_per_s": run.get("req_per_s"),
        "pass_req_per_s": run.get("pass_req_per_s"), "tpot_p50_ms": run.get("tpot_p50_ms"),
        "pass_tpot_p50_ms": run.get("pass_tpot_p50_ms"),
        "pass_ttft_p50_ms": run.get("pass_ttft_p50_ms"),
        "ttft_p50_ms": run.get("ttft_p50_ms"), "plugin_stages": run.get("plugin_stages"),
        "lane_wait_s": run.get("lane_wait_s"), "cadence": engine.get("cadence"),
        "cadence_trials": engine.get("cadence_trials_total"),
        "cadence_trial_steps": engine.get("cadence_trial_steps_total"),
        "cadence_switches": engine.get("cadence_switches_total"),
        "group_sizes": engine.get("group_sizes"),
        "stage_busy": [round(s["busy_fraction"], 3) for s in stages.values()] or None,
        "stage_step_ms": [round(s["step_ms"], 2) for s in stages.values()] or None,
        "graph_share": round(graphs / (graphs + eager), 3) if graphs + eager else None,
        "trial_outcomes": dict(sorted(Counter(  # how auto's last trials ended
            f"{t['cadence']} {t['outcome']}" for t in engine.get("recent_trials") or []).items())),
        "pass_stage_step_ms": run.get("pass_stage_step_ms"),
    }


def slots(directory: Path) -> list[dict[str, Any]]:
    """The k-th run of each lane, paired where both ran the same point."""
    a, b = (json.loads(path.read_text())["runs"] if path.exists() else []
            for path in (directory / f"lane-{lane}" / "bench.json" for lane in "ab"))
    paired = []
    for k, (run_a, run_b) in enumerate(zip(a, b), 1):
        if point_of(run_a) != point_of(run_b):
            continue
        row_a, row_b = run_row(run_a), run_row(run_b)
        ratio = (row_a["req_per_s"] / row_b["req_per_s"]
                 if row_a["req_per_s"] and row_b["req_per_s"] else None)
        input_len, concurrency, rate = point_of(run_a)
        paired.append({"slot": k, "input_len": input_len, "concurrency": concurrency,
                       "request_rate": rate, "a": row_a, "b": row_b, "a_over_b": ratio})
    return paired


#: What pass pairs are compared on: req/s, and the latencies (an open loop's req/s is its rate).
PASS_FIGURES = {"pass_ratios": "pass_req_per_s", "tpot_ratios": "pass_tpot_p50_ms",
                "ttft_ratios": "pass_ttft_p50_ms"}


def ratios(paired: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per point and pair of runners (X over Y): each slot's and pass pair's ratios, and medians."""
    table: dict[tuple, dict[str, list[float]]] = {}
    for slot in paired:
        if slot["a_over_b"] is None:
            continue
        x, y, r = slot["a"], slot["b"], slot["a_over_b"]
        if x["runner"] > y["runner"]:
            x, y, r = y, x, 1 / r
        point = (slot["input_len"], slot["concurrency"], slot.get("request_rate"))
        found = table.setdefault((*point, x["runner"], y["runner"]),
                                 {"ratios": [], **{name: [] for name in PASS_FIGURES}})
        found["ratios"].append(r)
        for name, figure in PASS_FIGURES.items():
            found[name].extend(a / b for a, b in zip(x[figure] or [], y[figure] or []) if a and b)
    return [{"input_len": i, "concurrency": c, "request_rate": q, "runner": x, "over": y,
             **{name: [round(v, 3) for v in values] for name, values in found.items()},
             **{name.replace("ratios", "median"): (round(statistics.median(values), 3)
                                                     if values else None)
                for name, values in found.items()}}
            for (i, c, q, x, y), found in sorted(table.items(), key=_point_order)]


def _point_order(item: tuple[tuple, Any]) -> tuple:
    input_len, concurrency, rate, x, y = item[0]
    return input_len, concurrency, rate or 0.0, x, y


def markdown(paired: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> str:
    lines = ["| slot | point | lane a | req/s (passes) | TPOT / TTFT p50 ms | lane b | req/s "
             "(passes) | TPOT / TTFT p50 ms | a / b |", "|---|---|---|---|---|---|---|---|---|"]
    for slot in paired:
        cells = []
        for lane in ("a", "b"):
            row = slot[lane]
            passes = ", ".join(f"{p:.2f}" for p in row["pass_req_per_s"] or [] if p)
            cells += [f"{row['runner']} ({row['cadence'] or '-'})", passes,
                      f"{_num(row['tpot_p50_ms'])} / {_num(row['ttft_p50_ms'], 0)}"]
        ratio = f"{slot['a_over_b']:.3f}" if slot["a_over_b"] else "-"
        label = point_label(slot["input_len"], slot["concurrency"], slot.get("request_rate"))
        lines.append(f"| {slot['slot']} | {label} | "
                     + " | ".join(cells) + f" | {ratio} |")
    lines += ["", "| point | runner | over | per slot | median | by pass | median of passes | "
              "TPOT p50, over (median of passes) | TTFT p50, over |",
              "|---|---|---|---|---|---|---|---|---|"]
    for pair in pairs:
        label = point_label(pair["input_len"], pair["concurrency"], pair.get("request_rate"))
        lines.append(f"| {label} | {pair['runner']} | "
                     f"{pair['over']} | {', '.join(map(str, pair['ratios']))} | "
                     f"{pair['median']} | {', '.join(map(str, pair['pass_ratios'])) or '-'} | "
                     f"{_num(pair['pass_median'], 3)} | {_num(pair['tpot_median'], 3)} | "
                     f"{_num(pair['ttft_median'], 3)} |")
    lines += ["", "| slot | lane | runner | step ms per stage, by pass | cadence at the end | "
              "switches | trials (steps) | how the last trials ended |",
              "|---|---|---|---|---|---|---|---|"]
    for slot in paired:
        for lane in ("a", "b"):
            row = slot[lane]
            if row["cadence"] is None:
                continue
            ended = ", ".join(f"{what} {n}" for what, n in row["trial_outcomes"].items())
            steps = ", ".join("/".join(map(str, p)) if p else "-"
                              for p in row["pass_stage_step_ms"] or []) or "-"
            lines.append(f"| {slot['slot']} | {lane} | {row['runner']} | {steps} | "
                         f"{row['cadence']} | "
                         f"{row['cadence_switches']} | {row['cadence_trials']} "
                         f"({row['cadence_trial_steps']}) | {ended or '-'} |")
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", type=Path)
    directory = parser.parse_args().directory
    paired = slots(directory)
    pairs = ratios(paired)
    (directory / "lanes.json").write_text(json.dumps({"slots": paired, "pairs": pairs},
                                                     indent=1))
    table = markdown(paired, pairs)
    (directory / "lanes.md").write_text(table)
    print(table)
    return 0 if paired else 1


if __name__ == "__main__":
    raise SystemExit(main())
