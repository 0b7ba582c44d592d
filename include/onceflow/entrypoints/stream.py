"""The onceflow streaming job of any declared app (onceflow.app), Kafka to Kafka, exactly once.

What spark-submit runs (launched by `onceflow job run|start` and the deploy DAG through onceflow.runtime.launcher);
settings come from the environment (onceflow.config), the app among them (ONCEFLOW_APP). The driver is
onceflow.runtime.driver; its exit code tells the supervisor what to do (onceflow.wire: EXIT_* and NO_RESTART).
"""

from onceflow.runtime.driver import main

if __name__ == "__main__":
    main()
