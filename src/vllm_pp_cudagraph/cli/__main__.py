"""``python -m vllm_pp_cudagraph.cli``: the ``vllm-pp-cudagraph`` command."""

import sys

from vllm_pp_cudagraph.cli.command import main

sys.exit(main())
