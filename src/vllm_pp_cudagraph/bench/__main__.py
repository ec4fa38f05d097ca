import sys

from vllm_pp_cudagraph.bench.cli import main

sys.exit(main())
