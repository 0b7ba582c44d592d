"""Kafka adapters: client configurations, bounded reads, the one transactional writer, topics, events."""
