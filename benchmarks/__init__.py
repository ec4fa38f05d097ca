"""GPU-run tooling and results of vllm-pp-cudagraph; not part of the installed package."""
