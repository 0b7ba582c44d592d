"""`airflow standalone` for the embedded stack: Airflow's own standalone command (api-server, scheduler,
dag-processor, triggerer), its scheduler and triggerer started with --skip-serve-logs.

Airflow 3.3's task log server (airflow.utils.serve_logs, which `airflow scheduler` starts under a local executor and
`airflow triggerer` always) binds every interface, 0.0.0.0 and ::, and has no setting for its address. Under
standalone every component writes to this machine's log folder, and the api-server reads task logs from there: the
log servers would add nothing but two ports open to the network. (While a task runs, its log view also lists a
failed attempt to reach the log server; the log itself is read from the file.) The api-server binds
AIRFLOW__API__HOST, which onceflow_dev.airflow_local sets from ONCEFLOW_LISTEN_HOST."""

from __future__ import annotations

import sys

SKIP_SERVE_LOGS = ("scheduler", "triggerer")


def main() -> None:
    from airflow.__main__ import main as airflow_main
    from airflow.cli.commands import standalone_command

    class SubCommand(standalone_command.SubCommand):
        def __init__(self, parent, name: str, command: list[str], env: dict[str, str]):
            if command and command[0] in SKIP_SERVE_LOGS and "--skip-serve-logs" not in command:
                command = [*command, "--skip-serve-logs"]
            super().__init__(parent, name, command, env)

    standalone_command.SubCommand = SubCommand  # type: ignore[misc]
    sys.argv = ["airflow", "standalone"]
    airflow_main()


if __name__ == "__main__":
    main()
