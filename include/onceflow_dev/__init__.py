"""Development tooling, not part of a production image: the embedded stack (a local broker, Airflow), the generator, benchmarks, chaos and soak runs."""
