"""GPU checks of the layouts PP users run, and of vLLM's attention backends.

Each check is one ``bench --workload batch`` invocation: per graph mode a stock
engine and the plugin's (its defaults), plus a second stock engine as the control,
with 64 requests of 64 greedy tokens queued as one batch. The plugin's tokens must
equal stock's, or part from them only at near ties, as stock's control may
(``bench/token_judge.py``). The check of ``VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto``
takes two: the plugin's, then stock's with the split the plugin logged. Skipped
without a GPU per rank; on one GPU run them through the shared-GPU shim with
``KIT_SHARED_GPU_STAGES`` at least the ranks needed (benchmarks/README.md, "GPU tests").
"""

from __future__ import annotations

import pytest

from e2e.bench_runs import (
    assert_served,
    assert_tokens_judged_equal,
    console_of,
    judged_against,
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
    "pp2": (2, 1, None, ALL_MODES),
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


def chosen_modes(config: pytest.Config, modes: tuple[str, ...]) -> tuple[str, ...]:
    """``modes`` narrowed to those ``--graph-modes`` names, in its order; all without it."""
    wanted = [m for m in config.getoption("--graph-modes").split(",") if m]
    if not wanted:
        return modes
    unknown = set(wanted) - set(ALL_MODES)
    if unknown:
        pytest.fail(f"--graph-modes: unknown {sorted(unknown)}; choose from {ALL_MODES}")
    picked = tuple(m for m in wanted if m in modes)
    if not picked:
        pytest.skip(f"--graph-modes {','.join(wanted)}: none of this layout's {modes}")
    return picked


@pytest.mark.parametrize("name", LAYOUTS)
def test_layout_serves_stocks_tokens_in_every_graph_mode(name, tmp_path, random_model,
                                                         request):
    """The plugin's runner on every worker of the layout (at PP=1: vLLM's, the plugin
    standing aside), and its greedy tokens stock's in every graph mode (or parting
    only at near ties, as stock's own second engine may)."""
    pp, tp, partition, modes = LAYOUTS[name]
    modes = chosen_modes(request.config, modes)
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


@pytest.mark.parametrize("pp", [2, 3], ids=["pp2", "pp3"])
def test_auto_layer_partition_serves_stocks_tokens(pp, tmp_path, random_model):
    """With VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto (``plugin-auto-split``) the engine
    serves on every stage with the split stage 0 logged, and its greedy tokens are those
    of a stock engine given that split by hand (or part only at near ties, as a second
    stock engine, the control, may from the first). The 0.6B shape has 28 layers."""
    require_gpus(pp)
    proc, runs = run_batch_bench(tmp_path / "auto", random_model,
                                 "plugin-auto-split:full_and_piecewise", "--pp", str(pp))
    assert_served(runs, pp, console_of(proc))
    used = runs[0].get("layer_partition_used")
    assert used and len(used) == pp and sum(used) == 28 and min(used) > 0, (
        f"the plugin's split: {used}")
    stock_proc, stock = run_batch_bench(
        tmp_path / "stock", random_model, "stock:full_and_piecewise,stock:full_and_piecewise",
        "--pp", str(pp), "--layer-partition", ",".join(map(str, used)))
    assert_served(stock, pp, console_of(stock_proc))
    assert [r["spec"]["layer_partition"] for r in stock] == [used, used]
    plugin, control = judged_against(stock[0], [runs[0], stock[1]])
    print(f"pp{pp}: auto split {used}; plugin vs stock {plugin['verdict']} "
          f"({plugin['requests_differ']}/{plugin['requests']}), control {control['verdict']} "
          f"({control['requests_differ']}/{control['requests']})")
    assert control["verdict"] in ("identical", "near-ties"), (
        f"stock differs from itself beyond a near tie: the check cannot decide ({control})")
    assert plugin["verdict"] in ("identical", "near-ties"), plugin
    assert proc.returncode == 0, console_of(proc)
    assert stock_proc.returncode == 0, console_of(stock_proc)
