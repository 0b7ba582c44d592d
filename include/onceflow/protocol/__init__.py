"""The exactly-once protocol: one Kafka transaction per micro-batch, the ledger read and written."""
