"""Per-stage pipeline metrics: the stages' snapshot files and the stat logger exporting them."""
