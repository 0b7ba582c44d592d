"""The operations on an app's history, each a batch application or a library call the CLI and the DAGs share:
audit, reconciliation recount, backfill, savepoints, quarantine."""
