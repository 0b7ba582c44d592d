"""onceflow: exactly-once Kafka-to-Kafka streaming on PySpark, operated from Airflow."""

__version__ = "0.1.0"
