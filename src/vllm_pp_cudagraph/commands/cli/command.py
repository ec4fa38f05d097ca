"""``vllm-pp-cudagraph`` command line."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata

from vllm_pp_cudagraph import __version__
from vllm_pp_cudagraph.shared import vllm_surface
from vllm_pp_cudagraph.commands.cli import install_check
from vllm_pp_cudagraph.commands.cli import proven_table
from vllm_pp_cudagraph.commands.cli.exit_status import (
    EXIT_BROKEN_INSTALL,
    EXIT_FAILED,
    EXIT_MISCONFIGURED,
    EXIT_NO_GPU,
    EXIT_OK,
    EXIT_UNSUPPORTED,
    TABLE,
    ArgumentParser,
)
from vllm_pp_cudagraph.shared import support
from vllm_pp_cudagraph.shared.engine_plan import EngineFacts
from vllm_pp_cudagraph.commands.planning.shapes import read_model_config
from vllm_pp_cudagraph.plugin import PLUGIN_NAME, check_runner_choice, is_enabled
from vllm_pp_cudagraph.shared.settings import (
    LayerPartition,
    PluginConfigError,
    PPCudaGraphSettings,
    SettingsError,
    environment_value,
    hand_set_partition,
)

#: The fast report's note on what only --full does.
FULL_ONLY = ("vLLM's import and the patch list: not tried (check --full imports vLLM's "
             "model-runner stack and lists the patches; 10-20 s on 2 cores)")


def _near_misses(value: str) -> list[str]:
    """Entries of VLLM_PLUGINS that look like a mistyped plugin name."""
    entries = [entry for entry in value.split(",") if entry != PLUGIN_NAME]
    # The name itself, with spaces, capitals or '-', matches too (a ratio of 1).
    return [entry for entry in entries if difflib.get_close_matches(
        entry.strip().lower().replace("-", "_"), [PLUGIN_NAME], n=1, cutoff=0.75)]


def _visible_gpus() -> list | None:
    """Each visible GPU's properties as torch gives them; None where torch is not
    installed or does not import."""
    try:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return [torch.cuda.get_device_properties(i) for i in range(count)]
    except Exception:  # a broken torch build raises more than ImportError
        return None


@contextlib.contextmanager
def _output_held_back(held: list[str]) -> Iterator[None]:
    """Hold back what imports print (vLLM's log, torch's warnings) until the report is out:
    file descriptors 1 and 2 go to a temporary file whose text is appended to ``held``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile(mode="w+") as sink:
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            held.append(sink.read())


class _Report:
    """The lines ``check`` prints, the problems found (in order, with exit codes), and what
    the imports printed meanwhile (``held``)."""

    def __init__(self, out) -> None:
        self.out = out
        self.problems: list[tuple[int, str]] = []  # (exit status, line), in order
        self.held: list[str] = []

    def say(self, line: str) -> None:
        print(line, file=self.out)

    def problem(self, code: int, line: str) -> None:
        """Print ``line``, which names a problem, and record it with its exit status."""
        self.say(line)
        self.problems.append((code, line.strip()))


#: vLLM's default ``max_num_seqs`` on GPUs under 70 GiB and A100s (1024 on H100 and H200).
DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class EngineShape:
    """The engine ``check --model`` reports the layer partition for: what its plan reads
    of it, and the GPU's total memory (None where not known: ``auto`` cannot be predicted)."""

    facts: EngineFacts
    gpu_memory_bytes: int | None = None


def check(out=None, engine: EngineShape | None = None, full: bool = False) -> int:
    """Report whether this install can run the plugin; return the first problem's status.
    ``engine``: also its layer partition; ``full``: also vLLM's imports and the patches."""
    report = _Report(out or sys.stdout)
    settings = settings_error = None
    try:
        settings = PPCudaGraphSettings.current()
    except SettingsError as exc:
        settings_error = exc
    versions = vllm_surface.installed_versions()
    report.say(f"vllm-pp-cudagraph {__version__}")
    _report_vllm(report, versions, settings)
    broken = _report_imports(report, versions, full)
    _report_plugins(report)
    _report_settings(report, settings, settings_error)
    if settings is not None:
        _report_partition(report, settings, engine)
    if broken is not None:
        report.say("patches: not listed (an import fails, see above)")
    elif not full:
        report.say(FULL_ONLY)
    elif versions.installed and settings is not None:
        _report_patches(report, settings)
    if versions.installed:
        _report_proven(report)
    _report_gpus(report)
    # Repeated last, where a reader of a long report looks first.
    for _, line in report.problems:
        report.say(f"to fix: {line}")
    if "".join(report.held).strip():
        print("\n-- printed by the imports above --\n" + "".join(report.held).rstrip(),
              file=sys.stderr)
    return report.problems[0][0] if report.problems else EXIT_OK


def _report_vllm(report: _Report, versions: vllm_surface.VersionInfo, settings) -> None:
    where = f"{versions.vllm or 'not installed'} (supported: {vllm_surface.SUPPORTED_RANGE})"
    if not versions.installed:
        report.problem(EXIT_UNSUPPORTED, f"vLLM: {where}  UNSUPPORTED")
    elif versions.supported:
        report.say(f"vLLM: {where}  OK; {proven_table.gpu_evidence(versions.vllm)}")
    elif settings is not None and settings.allow_unsupported_vllm:
        report.say(f"vLLM: {where}  UNSUPPORTED, allowed by "
                   "VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 (untested: the plugin's "
                   "overrides may not match this vLLM)")
    else:
        report.problem(EXIT_UNSUPPORTED, f"vLLM: {where}  UNSUPPORTED: install a supported "
                       "vLLM, or set VLLM_PP_CUDAGRAPH_ALLOW_UNSUPPORTED_VLLM=1 to try anyway")
    evidence = proven_table.torch_evidence(versions.vllm, versions.torch)
    report.say(f"torch: {versions.torch or 'not installed'}"
               + (f"; {evidence}" if evidence else ""))


def _report_imports(report: _Report, versions: vllm_surface.VersionInfo, full: bool):
    """Whether torch, torchvision (and with ``full`` vLLM) import; the failure, or None."""
    if not versions.installed:
        return None
    packages = install_check.PACKAGES if full else install_check.PACKAGES[:2]
    with _output_held_back(report.held):
        broken = install_check.import_failure(packages)
    names = ", ".join("vLLM" if p == "vllm" else p for p in packages)
    if broken is None:
        report.say(f"imports: {names} OK")
    else:
        report.problem(EXIT_BROKEN_INSTALL, f"imports: BROKEN: {broken.message()}")
    return broken


def _report_plugins(report: _Report) -> None:
    plugins_value = environment_value("VLLM_PLUGINS")
    if is_enabled():
        report.say(f"VLLM_PLUGINS={plugins_value!r}: plugin ENABLED")
        try:
            check_runner_choice()
        except PluginConfigError as exc:
            report.problem(EXIT_MISCONFIGURED, f"  ERROR: {exc}")
    elif plugins_value is None:
        report.say("VLLM_PLUGINS is unset: plugin INACTIVE (vLLM loads it, and it stays "
                   f"inert). Set VLLM_PLUGINS={PLUGIN_NAME} to enable it.")
    else:
        report.say(f"VLLM_PLUGINS={plugins_value!r}: plugin INACTIVE")
        for miss in _near_misses(plugins_value):
            report.problem(EXIT_MISCONFIGURED,
                           f"  ERROR: {miss!r} is not the plugin's name; did you mean "
                           f"{PLUGIN_NAME!r}? vLLM splits VLLM_PLUGINS on ',' and matches "
                           "names exactly (no spaces).")
    others = sorted(ep.name for ep in metadata.entry_points(group="vllm.general_plugins")
                    if ep.name != PLUGIN_NAME)
    report.say("  note: VLLM_PLUGINS also filters every other vLLM plugin: only the names "
               "it lists are loaded."
               + (f" Other installed general plugins: {', '.join(others)}." if others else ""))


def _report_settings(report: _Report, settings, error) -> None:
    if error is not None:
        report.problem(EXIT_MISCONFIGURED, f"settings: INVALID: {error}")
        return
    report.say("settings: OK")
    for name, value in settings.model_dump().items():
        report.say(f"  {PPCudaGraphSettings.env_name(name)}={value}")


def _report_partition(report: _Report, settings: PPCudaGraphSettings,
                      engine: EngineShape | None) -> None:
    from vllm_pp_cudagraph.shared import layer_partition
    from vllm_pp_cudagraph.commands.planning.plan import planned_split
    from vllm_pp_cudagraph.shared.stage_costs import num_hidden_layers

    setting = settings.layer_partition
    if engine is None:
        if hand := hand_set_partition():
            report.say(f"layer partition: hand-set {layer_partition.VLLM_ENV}={hand} "
                       "(wins over VLLM_PP_CUDAGRAPH_LAYER_PARTITION)")
        elif setting is LayerPartition.AUTO:
            report.say("layer partition: auto, chosen per engine at start-up; "
                       "'check --model DIR --pp N' shows it for a model")
        else:
            report.say("layer partition: vLLM's split (VLLM_PP_CUDAGRAPH_LAYER_PARTITION=vllm)")
        return
    facts, gpu_bytes = engine.facts, engine.gpu_memory_bytes
    unknown = ("auto cannot be predicted here: no GPU is visible to read its memory from; "
               "pass --gpu-memory-gib (the GPU's total memory in GiB, e.g. 141 for an H200)")
    try:
        decision = planned_split(setting, facts, gpu_bytes)
        # Undecided: auto without the GPU's memory, which only the workers read.
        lines = [unknown] if decision.undecided else decision.describe()
        if decision.layers is None and facts.pp > 1:
            # vLLM's own split, as its get_pp_indices gives it without a hand-set one.
            split = vllm_surface.vllm_split(num_hidden_layers(facts.model), facts.pp)
            lines[0] += f": layers {','.join(map(str, split))} per stage"
        if decision.source == "vllm" and setting is LayerPartition.VLLM and facts.pp > 1:
            auto = (unknown if gpu_bytes is None
                    else planned_split(LayerPartition.AUTO, facts, gpu_bytes).describe()[0])
            lines.append(f"with VLLM_PP_CUDAGRAPH_LAYER_PARTITION=auto: {auto}")
    except layer_partition.LayerPartitionError as exc:
        report.problem(EXIT_MISCONFIGURED, f"layer partition: REFUSED: {exc}")
        return
    report.say(f"layer partition: {lines[0]}")
    for line in lines[1:]:
        report.say(f"  {line}")


def _report_patches(report: _Report, settings: PPCudaGraphSettings) -> None:
    """Each patch and why it stands aside, if it does; a problem where vLLM's internals moved."""
    from vllm_pp_cudagraph.patches import PATCHES, standing

    try:
        with _output_held_back(report.held):
            rows = standing(settings)
    except Exception as exc:  # a vLLM whose internals differ from SURFACE's
        missing = vllm_surface.missing_surface()
        report.problem(EXIT_BROKEN_INSTALL,
                       f"patches: could not be listed: {install_check.describe(exc)}"
                       + (f". Missing from this vLLM: {'; '.join(missing)}" if missing else ""))
        return
    report.say("patches when enabled, on this vLLM with these settings:")
    for patch, why in rows:
        state = "applies" if why is None else f"stands aside: {why}"
        report.say(f"  - {patch.name} ({_processes(patch)}): {state}  [{patch.target}]")
    for scoped in [p for p in PATCHES if p.scope]:
        report.say(f"  - {scoped.name} ({_processes(scoped)}): applied later by "
                   f"{scoped.scope}  [{scoped.target}]")


def _processes(patch) -> str:
    """The processes a patch is applied in, as ``check --full`` names them."""
    from vllm_pp_cudagraph.patches import EVERY_PROCESS, Process

    if patch.processes == EVERY_PROCESS:
        return "every process"
    return ", ".join(p.value for p in Process if p in patch.processes)


def _report_proven(report: _Report) -> None:
    report.say("what the plugin has been proven with on GPUs, on this vLLM:")
    for line in proven_table.table_lines():
        report.say(f"  - {line}")


def _plan_gpu(name: str | None):
    """The GPU ``plan`` predicts for, and how it was chosen: ``--gpu``, else the visible
    GPU where ``plan`` knows it, else the H200 the model was fitted on."""
    from vllm_pp_cudagraph.commands.planning.gpus import FITTED_ON, GPUS, by_device_name

    if name is not None:
        return GPUS[name], "--gpu"
    gpus = _visible_gpus()
    visible = gpus[0].name if gpus else None
    if visible and (gpu := by_device_name(visible)) is not None:
        return gpu, f"the visible {visible}"
    return FITTED_ON, ("assumed: --gpu names yours" if not visible else
                       f"assumed: the visible {visible} is not one plan knows; --gpu names one")


def _gpu_memory_bytes() -> int | None:
    """The first visible GPU's total memory; None where torch sees none."""
    gpus = _visible_gpus()
    return int(gpus[0].total_memory) if gpus else None


def _report_gpus(report: _Report) -> None:
    gpus = _visible_gpus()
    if gpus is None:
        report.say("GPUs visible: unknown (torch is not installed or does not import)")
    elif not gpus:
        report.problem(EXIT_NO_GPU, "GPUs visible: 0  PROBLEM: no NVIDIA GPU visible; vLLM "
                       "cannot serve here (check the driver and CUDA_VISIBLE_DEVICES)")
    else:
        report.say(f"GPUs visible: {len(gpus)}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from vllm_pp_cudagraph.commands.bench import cli as bench

        return bench.main(argv[1:])
    parser = ArgumentParser(prog="vllm-pp-cudagraph",
                            description="Pipeline-parallel CUDA graphs for vLLM Model Runner V2.")
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    check_parser = sub.add_parser(
        "check", description="Report whether this install can run the plugin. " + TABLE,
        help="Report versions, whether torch and torchvision import, whether the plugin "
        "is enabled, the settings, what is proven and the GPUs visible, in seconds. " + TABLE)
    check_parser.add_argument("--full", action="store_true",
                              help="also import vLLM's model-runner stack and list which "
                              "patches apply or stand aside (10-20 s on 2 cores)")
    check_parser.add_argument("--model", metavar="DIR",
                              help="a model directory (its config.json) or a built-in shape "
                              "(as for bench --model): also say which layer partition an "
                              "engine of it at --pp stages uses, and why")
    check_parser.add_argument("--pp", type=int, metavar="N",
                              help="the pipeline-parallel size, with --model")
    check_parser.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                              help="the engine's max_num_batched_tokens, with --model "
                              "(default: at least --max-num-seqs, as vLLM requires)")
    _add_engine_arguments(check_parser)
    plan_parser = _add_plan_parser(sub)
    sub.add_parser("bench", help="Throughput and latency per CUDA-graph mode at PP, plugin "
                   "vs stock (see 'bench --help').")
    args = parser.parse_args(argv)
    # Each command's errors name its own --help.
    if args.command == "plan":
        return plan(plan_parser, args)
    return check(engine=_engine_shape(check_parser, args), full=args.full)


def _add_engine_arguments(parser: ArgumentParser) -> None:
    """The engine's batch and memory, which ``check --model`` and ``plan`` both read."""
    parser.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, metavar="N",
                        help=f"the engine's max_num_seqs (default {DEFAULT_MAX_NUM_SEQS}; "
                        "vLLM's default is 1024 on H100 and H200)")
    parser.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                        help="each GPU's total memory in GiB (default: plan's --gpu, else the "
                        "first visible GPU's); auto's split depends on it")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.92, metavar="F",
                        help="the engine's gpu_memory_utilization (default 0.92, vLLM's)")


def _add_plan_parser(sub) -> ArgumentParser:
    from vllm_pp_cudagraph.commands.planning.gpus import GPUS
    from vllm_pp_cudagraph.commands.planning.pipeline_model import LINKS

    plan_parser = sub.add_parser(
        "plan",
        help="Predict what PP with the plugin, stock PP and TP deliver for a model on N "
        "GPUs, and which to choose (no GPU needed).",
        description="Predict each layout of a model over --gpus GPUs from what its parts "
        "cost per decode step. " + TABLE)
    plan_parser.add_argument("--model", metavar="DIR", required=True,
                             help="a model directory (its config.json) or a built-in shape")
    plan_parser.add_argument("--gpus", type=int, required=True, metavar="N")
    load = plan_parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=256, metavar="C",
                      help="requests in flight, as vllm bench serve --max-concurrency "
                      "(default 256)")
    load.add_argument("--prompts", type=int, metavar="P",
                      help="an offline batch of P requests instead (LLM.generate)")
    plan_parser.add_argument("--input-len", type=int, default=64, metavar="I")
    plan_parser.add_argument("--output-len", type=int, default=256, metavar="O")
    plan_parser.add_argument(
        "--api-server-count", type=int, default=1, metavar="N",
        help="vllm serve --api-server-count (default 1): serving predictions are held to "
        "what that many API servers put out in the committed cells they bound")
    plan_parser.add_argument("--interconnect", choices=sorted(LINKS), default="nvlink")
    plan_parser.add_argument(
        "--gpu", choices=sorted(GPUS), default=None,
        help="the GPU model (its datasheet's memory, bandwidth and FLOPs); default: the "
        "visible GPU where it is one of these, else an H200")
    _add_engine_arguments(plan_parser)
    return plan_parser


def plan(parser: ArgumentParser, args: argparse.Namespace) -> int:
    """``vllm-pp-cudagraph plan``: print each layout's prediction; the exit status."""
    from vllm_pp_cudagraph.commands.planning.gpus import rates
    from vllm_pp_cudagraph.shared.layer_partition import Memory
    from vllm_pp_cudagraph.commands.planning.measured import matching, stock_calibration
    from vllm_pp_cudagraph.commands.planning.pipeline_model import Workload, shard_costs
    from vllm_pp_cudagraph.commands.planning.plan import PlanError, make_plan, recommended, render
    from vllm_pp_cudagraph.shared.stage_costs import ModelShape, stage_costs

    _check_ranges(parser, args, ("gpus", "concurrency", "prompts", "input_len", "output_len",
                                 "max_num_seqs", "api_server_count"))
    try:
        config = read_model_config(args.model)  # an unknown model is named first
    except ValueError as exc:
        parser.error(str(exc))
    gpu, gpu_said = _plan_gpu(args.gpu)
    if args.gpu_memory_gib is not None:
        gpu_bytes = int(args.gpu_memory_gib * 2**30)
    else:
        # --gpu's memory, else the visible GPU's, else that of the GPU assumed (help).
        visible = None if args.gpu is not None else _gpu_memory_bytes()
        gpu_bytes = visible or int(gpu.memory_gib * 2**30)
    try:
        settings = PPCudaGraphSettings.current()
        work = Workload(args.concurrency, args.input_len, args.output_len, args.max_num_seqs,
                        args.prompts, args.api_server_count)
        memory = Memory(gpu_bytes, args.gpu_memory_utilization)
        stock = stock_calibration(vllm_surface.installed_versions().vllm, work.kind)
        gpu_rates = rates(gpu)
        rows, decision = make_plan(config, args.gpus, work, memory, args.interconnect,
                                   settings.layer_partition, gpu_rates, stock.factor)
    except (ValueError, PlanError, SettingsError) as exc:
        parser.error(str(exc))
    shape = ModelShape.from_config(config)
    source = stage_costs(shape, work.running, rates=gpu_rates).source
    if args.gpus > 1:
        shard = shard_costs(shape, args.gpus, work.running,
                            lambda batch: stage_costs(shape, batch, rates=gpu_rates), gpu_rates)
        source += f"; TP={args.gpus}'s shard on {shard.source}"
    print(f"{args.model} on {args.gpus} GPUs ({gpu_bytes / 2**30:.0f} GiB x "
          f"{args.gpu_memory_utilization}), {args.interconnect}; {work.running} requests "
          f"decoding, {args.input_len} in / {args.output_len} out")
    print(f"GPU: {gpu.name} ({gpu_said}; {gpu.bytes_per_s / 1e12:.2f} TB/s, "
          f"{gpu.bf16_flops / 1e12:.0f} TFLOPS BF16 by its datasheet)")
    print(f"PP={args.gpus} layer split: {decision.describe()[0]}")
    print(f"stock PP: {stock.factor:.2f}x the plugin's GPU time per step, as measured on vLLM "
          f"{stock.vllm} ({stock.workload}: {stock.how}; {stock.source})")
    measured = matching(shape, args.gpus, work, args.interconnect,
                        lambda name: ModelShape.from_config(read_model_config(name)))
    for line in render(rows, work, source, args.model, measured):
        print(line)
    # A plan that fits nothing answers, and a script asking it must not read "in order".
    return EXIT_FAILED if recommended(rows, work) is None else EXIT_OK


def _check_ranges(parser: ArgumentParser, args: argparse.Namespace,
                  counts: tuple[str, ...]) -> None:
    """Stop with the flag's name where a count given is below 1 or the memory flags, which
    ``check`` and ``plan`` share, are out of range."""
    for name in counts:
        if (value := getattr(args, name)) is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1]")
    if args.gpu_memory_gib is not None and args.gpu_memory_gib <= 0:
        parser.error("--gpu-memory-gib must be positive")


def _engine_shape(parser: ArgumentParser, args: argparse.Namespace) -> EngineShape | None:
    if args.model is None and args.pp is None:
        return None
    if args.model is None or args.pp is None:
        parser.error("--model and --pp go together")
    _check_ranges(parser, args, ("pp", "max_num_seqs"))
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < args.max_num_seqs:
        parser.error("--max-num-batched-tokens must be at least --max-num-seqs")
    gpu_bytes = (_gpu_memory_bytes() if args.gpu_memory_gib is None
                 else int(args.gpu_memory_gib * 2**30))
    try:
        facts = EngineFacts(args.pp, read_model_config(args.model), args.max_num_seqs,
                            args.max_num_batched_tokens,
                            gpu_memory_utilization=args.gpu_memory_utilization)
        return EngineShape(facts, gpu_bytes)
    except ValueError as exc:
        parser.error(str(exc))
