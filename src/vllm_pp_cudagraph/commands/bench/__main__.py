import sys

from vllm_pp_cudagraph.commands.bench.cli import main

sys.exit(main())
