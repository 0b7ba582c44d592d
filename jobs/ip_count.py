"""The onceflow streaming job: IP request counts per 5 s window, Kafka to Kafka, exactly once.

What spark-submit runs (launched by `onceflow job run|start` and the deploy DAG through onceflow.runtime.launcher);
settings come from the environment (onceflow.config). The driver is onceflow.runtime.driver; its exit code tells
the supervisor what to do (onceflow.wire: 0 stopped, 2 misconfiguration, 3 fenced, 4 divergent history, 5 another
instance holds the app's lock here; anything else is a crash, restarted after a fixed delay).
"""

from onceflow.runtime.driver import main

if __name__ == "__main__":
    main()
