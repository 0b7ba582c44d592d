"""The control plane the DAGs call: deploy, health, transaction watch, rotation, reconciliation, alerts."""
