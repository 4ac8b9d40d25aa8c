"""A training run's life around the model: how its process meets SIGTERM and Ctrl-C (``signals``,
standard library only, installed by the entry point's runtime), the callbacks that keep its results
safe and show it alive (``guards``: a NaN loss stops it, an interrupt saves its newest state, its
heartbeat tag), and resuming it into the same MLflow run (``resume``).

It stands on tracking; training (``attnseq.training``) uses it, and it never imports training."""
