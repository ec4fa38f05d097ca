"""Between a worker's stage and the next: hand-off, checks, exchange, tokens and failure."""
