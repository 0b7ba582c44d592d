"""PostgreSQL as an app's sink: the app's schema (schema), connections and the ledger's reads (client). The protocol
that writes it is onceflow.protocol.database_sink."""
