"""``python -m vllm_pp_cudagraph.commands.cli``: the ``vllm-pp-cudagraph`` command."""

import sys

from vllm_pp_cudagraph.commands.cli.command import main

sys.exit(main())
