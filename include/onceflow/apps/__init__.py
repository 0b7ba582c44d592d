"""The batch applications: audit, reconciliation recount, backfill, savepoints, quarantine."""
