"""GPU checks of the layouts PP users run, and of vLLM's attention backends.

Each check is one ``bench --workload batch`` invocation: per graph mode a stock
engine and the plugin's (its defaults), plus a second stock engine as the control,
with 64 requests of 64 greedy tokens queued as one batch. The plugin's tokens must
equal stock's, or part from them only at near ties, as stock's control may
(``bench/token_judge.py``). Skipped without a GPU per rank; on one GPU run them
through the shared-GPU shim with ``KIT_SHARED_GPU_STAGES`` at least the ranks needed
(benchmarks/README.md, "GPU tests").
"""

from __future__ import annotations

import pytest

from e2e.bench_runs import (
    assert_served,
    assert_tokens_judged_equal,
    console_of,
    run_batch_bench,
    verdict_line,
)
from e2e.conftest import require_gpus

pytestmark = pytest.mark.gpu

ALL_MODES = ("full_and_piecewise", "piecewise", "full_decode_only", "eager", "breakable")

#: name: (pp, tp, layers per stage or None for vLLM's split, graph modes). The shape has
#: 28 layers; the "light-last" splits leave the stage with the LM head and sampler fewer.
LAYOUTS = {
    # no pipeline: the plugin enabled stands aside on every worker
    "pp1": (1, 1, None, ("full_and_piecewise", "eager")),
    "pp3": (3, 1, None, ALL_MODES),
    "pp3-light-last": (3, 1, "10,10,8", ALL_MODES),
    "pp4": (4, 1, None, ALL_MODES),
    "pp4-8776": (4, 1, "8,7,7,6", ALL_MODES),
    "pp4-light-last": (4, 1, "8,8,7,5", ALL_MODES),
    "tp2xpp2": (2, 2, None, ("full_and_piecewise", "eager")),
}

#: vLLM's attention backends checked at PP=2, each with the plugin's defaults (the
#: KV-cache write inside its piecewise graphs included).
BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")


def modes_with_control(modes) -> str:
    """stock, the plugin and stock again (the control) in the first mode, then stock and
    the plugin in each other mode: a run cut short has the control."""
    first, *rest = modes
    return ",".join([f"stock:{first}", f"plugin:{first}", f"stock:{first}"]
                    + [f"{runner}:{m}" for m in rest for runner in ("stock", "plugin")])


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_serves_stocks_tokens_in_every_graph_mode(name, tmp_path, random_model):
    """The plugin's runner on every worker of the layout (at PP=1: vLLM's, the plugin
    standing aside), and its greedy tokens stock's in every graph mode (or parting
    only at near ties, as stock's own second engine may)."""
    pp, tp, partition, modes = LAYOUTS[name]
    require_gpus(pp * tp)
    extra = ["--pp", str(pp), "--tp", str(tp)]
    if partition:
        extra += ["--layer-partition", partition]
    proc, runs = run_batch_bench(tmp_path / "bench", random_model, modes_with_control(modes),
                                 *extra)
    console = console_of(proc)
    assert_served(runs, pp * tp, console)
    for run in runs:
        assert (run["spec"]["pp"], run["spec"]["tp"]) == (pp, tp)
        expected = [int(n) for n in partition.split(",")] if partition else None
        assert run["spec"]["layer_partition"] == expected
    print(f"{name}: {verdict_line(runs)}")
    assert_tokens_judged_equal(runs)
    assert proc.returncode == 0, console


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_backend_serves_stocks_tokens(backend, tmp_path, random_model):
    """PP=2 with ``backend``: the engines run it, and the plugin's tokens are stock's
    in FULL_AND_PIECEWISE (piecewise prefill graphs, full decode graphs)."""
    require_gpus(2)
    proc, runs = run_batch_bench(tmp_path / "bench", random_model,
                                 modes_with_control(("full_and_piecewise",)),
                                 "--attention-backend", backend)
    console = console_of(proc)
    assert_served(runs, 2, console)
    for run in runs:
        assert backend in (run.get("attention_backend_used") or ""), (
            f"{run['spec']['runner']} ran {run.get('attention_backend_used')}, not {backend}")
    print(f"{backend}: {verdict_line(runs)}")
    assert_tokens_judged_equal(runs)
    assert proc.returncode == 0, console
