"""Free loopback ports for a private stack: the settings a bench, a chaos run or a test passes to config.load to get
its own brokers (and on the cluster topology its own Spark master) beside anything else running."""

from __future__ import annotations

from onceflow import config
from onceflow.runtime import procs


def kafka(brokers: int = 1) -> dict:
    """`brokers` Kafka nodes: their client ports and the first controller port (the others follow it, spaced as
    Settings.kafka_nodes spaces them)."""
    return {
        "brokers": brokers,
        "bootstrap_servers": ",".join(f"127.0.0.1:{procs.free_port()}" for _ in range(brokers)),
        "controller_port": procs.free_port_run(brokers, config.NODE_PORT_STEP),
    }


def cluster(brokers: int = 3) -> dict:
    """The loopback cluster of docs/cluster.md: three brokers and a Spark standalone master."""
    return {**kafka(brokers), "master": f"{config.STANDALONE_SCHEME}127.0.0.1:{procs.free_port()}"}
