"""``bench`` records the other processes computing on a run's GPUs, and says the run is not
comparable: another job's kernels take the GPU's time, and moved compiled-mode tokens."""

import argparse
import os
import stat

from vllm_pp_cudagraph.commands.bench import gpu_neighbours as neighbours_module
from vllm_pp_cudagraph.commands.bench.gpu_neighbours import gpu_neighbours, merged
from vllm_pp_cudagraph.commands.bench.report import print_findings

# GPUs 0-3 by index (-i picks some); compute apps from $FAKE_APPS, one "uuid, pid, MiB" a line.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
  --query-gpu=uuid)
    ids=0,1,2,3
    [ "$2" = -i ] && ids=$3
    for i in $(echo "$ids" | tr , ' '); do echo "GPU-$i"; done ;;
  --query-compute-apps=*)
    [ -f "$FAKE_APPS" ] && cat "$FAKE_APPS" ;;
esac
"""


def _fake_nvidia_smi(tmp_path, monkeypatch, apps: str):
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "apps").write_text(apps)
    monkeypatch.setenv("FAKE_APPS", str(tmp_path / "apps"))
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")


def test_only_processes_on_the_runs_own_gpus_are_its_neighbours(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "GPU-0, 4100, 1536\nGPU-2, 4200, 70000\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpu_neighbours(settle_s=0) == [{"pid": 4100, "used_mib": 1536}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert gpu_neighbours(settle_s=0) == [{"pid": 4200, "used_mib": 70000}]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert [n["pid"] for n in gpu_neighbours(settle_s=0)] == [4100, 4200]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu_neighbours(settle_s=0) == []


def test_a_process_gone_by_the_second_look_is_not_a_neighbour(tmp_path, monkeypatch):
    """An engine's worker still exiting as the next run starts is not another job."""
    _fake_nvidia_smi(tmp_path, monkeypatch, "GPU-0, 4100, 1536\nGPU-0, 4300, 900\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")

    def second_look(_seconds):
        (tmp_path / "apps").write_text("GPU-0, 4300, 900\n")

    monkeypatch.setattr(neighbours_module.time, "sleep", second_look)
    assert gpu_neighbours() == [{"pid": 4300, "used_mib": 900}]


def test_without_nvidia_smi_no_neighbour_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_neighbours(settle_s=0) == []


def test_neighbours_seen_before_and_after_a_run_are_listed_once():
    before = [{"pid": 1, "used_mib": 10}, {"pid": 2, "used_mib": 20}]
    after = [{"pid": 2, "used_mib": 25}, {"pid": 3, "used_mib": 30}]
    assert merged(before, after) == [{"pid": 1, "used_mib": 10}, {"pid": 2, "used_mib": 20},
                                     {"pid": 3, "used_mib": 30}]


def test_a_run_that_shared_its_gpus_is_called_not_comparable(capsys):
    args = argparse.Namespace(pp=2)
    shared = {"spec": {"runner": "stock", "mode": "piecewise"}, "plugin_stages": 0,
              "gpu_neighbours": [{"pid": 4100, "used_mib": 1536}]}
    alone = {"spec": {"runner": "plugin", "mode": "piecewise"}, "plugin_stages": 2,
             "gpu_neighbours": []}
    print_findings(args, [shared, alone], [])
    lines = [line for line in capsys.readouterr().out.splitlines() if "GPU SHARED" in line]
    assert len(lines) == 1 and "stock:piecewise" in lines[0] and "pid 4100" in lines[0]
