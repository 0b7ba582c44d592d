"""The onceflow operator console inside Airflow: its FastAPI app (onceflow.control.console) mounted at /onceflow,
reached from Airflow's navigation and from an "onceflow" tab on the DAG pages. Every route requires Airflow's
authentication and read access to the onceflow DAGs (docs/console.md)."""

from airflow.plugins_manager import AirflowPlugin

from onceflow.control.console.app import create_app

PREFIX = "/onceflow"


class OnceflowConsole(AirflowPlugin):
    name = "onceflow_console"
    fastapi_apps = [{"app": create_app(), "url_prefix": PREFIX, "name": "onceflow console"}]
    external_views = [
        # the console in Airflow's navigation
        {
            "name": "onceflow",
            "href": f"{PREFIX}/now",
            "url_route": "onceflow",
            "destination": "nav",
            "icon": f"{PREFIX}/icon.svg",
        },
        # a tab on every DAG page: the console's page for that DAG (the job, its transactions, its savepoints, ...)
        {"name": "onceflow", "href": f"{PREFIX}/dag/{{DAG_ID}}", "url_route": "onceflow-dag", "destination": "dag"},
    ]
