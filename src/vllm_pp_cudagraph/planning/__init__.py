"""Predictions made before anything runs: what each layout of a model on N GPUs delivers."""
