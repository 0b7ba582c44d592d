"""Spark adapters: the parsing rules in Spark SQL, the streaming plan, batch statistics."""
