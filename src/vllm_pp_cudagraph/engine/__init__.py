"""What the engine core runs: the scheduler hook and its cadence chooser, the check of
the workers, and the fix for preemption under async scheduling."""
