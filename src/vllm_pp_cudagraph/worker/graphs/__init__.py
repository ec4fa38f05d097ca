"""The worker's CUDA graphs: the manager, what is captured, the capture guard, the agreement."""
