"""Storage adapters: the Spark checkpoint's files (local or any Hadoop-compatible store)."""
