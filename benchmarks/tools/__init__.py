"""Serving soak, its load and verdicts, and the serving checks: repository tooling.

Not installed with the package: it drives the package's ``bench`` modules
(:mod:`vllm_pp_cudagraph.commands.bench`) and needs the test-only vLLM plugins in
``tests/e2e/soak_plugins``. Run it from the repository root, with the package
installed:

    python -m benchmarks.tools.soak --out DIR ...
    python -m benchmarks.tools.soak_pool DIR/soak.json ...
    python -m benchmarks.tools.serve_checks structured|fault --out DIR

- :mod:`.soak`: every graph mode behind ``vllm serve``, compared with stock
- :mod:`.soak_judge`: how the soak judges outputs (shares, token check)
- :mod:`.soak_pool`: the soak's rule over the runs of several soaks
- :mod:`.sampling_mix`: the sampling options the soak's load may send
- :mod:`.serve_checks`: structured outputs and a stage fault, behind ``vllm serve``
- :mod:`.token_check_sensitivity`: what the token check's margins look like (CPU)
"""
