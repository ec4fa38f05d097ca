"""Between a worker's stage and the next: the hand-off, its checks, the exchange of
facts between stages, the first stage's tokens and a stage's failure."""
