"""What spark-submit runs: the streaming job (stream.py) and the batch jobs (reconcile.py, backfill.py), each a file
of this package so that an installed onceflow launches them without a checkout (onceflow.runtime.launcher names
their paths). Nothing imports them."""
