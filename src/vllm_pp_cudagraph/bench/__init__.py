"""Benchmark, load and soak tooling for vllm-pp-cudagraph.

Kept apart from the plugin: nothing in the product imports this package. It
drives whole vLLM engines and servers (plugin, stock Model Runner V2 and the
V1 runner side by side) and judges their speed and outputs.

- :mod:`.cli`: ``vllm-pp-cudagraph bench`` (also ``python -m vllm_pp_cudagraph.bench``)
- :mod:`.engine_run`: one engine per run, in a child process
- :mod:`.serve_run`, :mod:`.serve_load`: ``vllm serve`` and the load sent to it
- :mod:`.soak`, :mod:`.soak_judge`, :mod:`.soak_pool`: the serving soak and its verdicts
- :mod:`.dummy_model`, :mod:`.stats`, :mod:`.trace_analysis`: shapes, statistics, profiles
"""
