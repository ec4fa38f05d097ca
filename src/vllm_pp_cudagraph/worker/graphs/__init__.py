"""The worker's CUDA graphs: the manager, what is captured, the guard around capture,
the stages' agreement on one set, graph memory and the piecewise split."""
