"""Use the plugin's runner without the plugin entry point.

vLLM's ``worker_cls`` setting names the worker class every worker process
builds. ``PPGraphWorker`` below builds its Model Runner V2 through
``vllm_pp_cudagraph.build_runner``, the factory the plugin itself uses: the
plugin's runner (its graphs, checked stage hand-offs and stage agreement), or
vLLM's own where the plugin stands aside for the engine. The plugin's scheduler
changes (its decode cadence) do not apply, since they live in the engine core
and come with ``VLLM_PLUGINS=pp_cudagraph``. Needs 2 NVIDIA GPUs, vLLM and
vllm-pp-cudagraph. MODEL is a Hugging Face hub name or a local model directory.

    python examples/direct_runner.py [MODEL] [--load-format dummy]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _example import model_arguments

if __name__ != "__main__":  # vLLM's worker processes import this module by name
    from vllm.v1.worker.gpu_worker import Worker

    class PPGraphWorker(Worker):
        """vLLM's GPU worker, building its Model Runner V2 through the plugin's factory."""

        def init_device(self) -> None:
            if not hasattr(Worker, "_make_model_runner"):
                # Before vLLM 0.32 the worker builds MRV2 from this module attribute.
                import vllm.v1.worker.gpu.model_runner as model_runner

                from vllm_pp_cudagraph import build_runner

                model_runner.GPUModelRunner = build_runner
            super().init_device()

        def _make_model_runner(self):  # vLLM 0.32+: "subclasses override this"
            from vllm_pp_cudagraph import build_runner

            return build_runner(self.vllm_config, self.device)

        def runner_class(self) -> str:
            return type(self.model_runner).__name__


def main() -> int:
    args = model_arguments(__doc__)

    # Worker processes import PPGraphWorker from this file by name.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p)
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # the runner is an MRV2 runner
    os.environ.pop("VLLM_PLUGINS", None)

    from vllm import LLM, SamplingParams

    llm = LLM(os.path.expanduser(args.model), pipeline_parallel_size=2,
              load_format=args.load_format, max_model_len=1024, gpu_memory_utilization=0.5,
              worker_cls="direct_runner.PPGraphWorker")
    print("runner per stage:", llm.collective_rpc("runner_class"))
    for output in llm.generate(["Pipeline parallelism splits a model"],
                               SamplingParams(max_tokens=24, temperature=0.0)):
        print(f"{output.prompt!r} -> {output.outputs[0].text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
