"""``vllm-pp-cudagraph bench``: the plugin against stock vLLM on your model.

The plugin's own modules never import this package; the CLI loads it only for
``bench``. It drives whole vLLM engines and servers (plugin, stock Model
Runner V2 and the V1 runner side by side) and reports their speed and whether
their tokens agree.

- :mod:`.cli`: ``vllm-pp-cudagraph bench`` (also ``python -m vllm_pp_cudagraph.commands.bench``)
- :mod:`.arguments`, :mod:`.argument_checks`: its options, and what it refuses at once
- :mod:`.runs`, :mod:`.judging`, :mod:`.report`: its runs, their verdicts, what it shows
  and writes
- :mod:`.engine_run`: one engine per run, in a child process
- :mod:`.serve_run`, :mod:`.serve_load`: ``vllm serve`` and the load sent to it
- :mod:`.dummy_model`, :mod:`.stats`, :mod:`.trace_analysis`: shapes, statistics, profiles
"""
