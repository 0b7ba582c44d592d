"""docker-compose.yaml's entrypoint of the Airflow containers, before the image's own (/entrypoint): the Docker
secrets under /run/secrets become what onceflow and Airflow's connections read, in this process's environment
only (never in the compose file, `docker inspect` or a command line):

  ONCEFLOW_<NAME>_SECRET_FILE=<path>                  -> ONCEFLOW_<NAME>=<the file's one line>
  AIRFLOW_CONN_<ID>={..., "password_file": <path>}    -> the same connection with "password": <the line>
  SPARK_AUTH_SECRET_FILE=<path>, SPARK_CONF_DIR=<dir> -> <dir>/spark-defaults.conf (0600): the driver's Spark
      authentication and encryption keyed by that secret, as docker/spark-run.sh writes it for the master and
      the workers (Spark standalone reads no secret file itself)

Airflow's own keys (Fernet, API, JWT, the database's URL) are not handled here: Airflow runs their
AIRFLOW__<SECTION>__<KEY>_CMD. umask 002: files on the shared onceflow-var volume stay writable by its group (0),
which the Spark executors (uid 185) are in. Then the rest of the arguments are exec'd.
"""

import json
import os
import sys
from pathlib import Path

SUFFIX = "_SECRET_FILE"


def secret(path: str) -> str:
    value = Path(path).read_text().removesuffix("\n")
    if not value or "\n" in value:
        raise SystemExit(f"airflow-entrypoint: {path} must hold one non-empty line")
    return value


def spark_defaults(auth_secret: str) -> str:
    conf = {
        "spark.authenticate": "true",
        "spark.authenticate.secret": auth_secret,
        "spark.network.crypto.enabled": "true",
        "spark.hadoop.fs.permissions.umask-mode": "002",
    }
    return "".join(f"{k} {v}\n" for k, v in conf.items())


def environment(env: dict[str, str]) -> dict[str, str]:
    out = {}
    for k, v in env.items():
        if k.startswith("ONCEFLOW_") and k.endswith(SUFFIX):
            out[k.removesuffix(SUFFIX)] = secret(v)
        elif k.startswith("AIRFLOW_CONN_") and '"password_file"' in v:
            spec = json.loads(v)
            spec["password"] = secret(spec.pop("password_file"))
            out[k] = json.dumps(spec)
        else:
            out[k] = v
    return out


def main(argv: list[str]) -> None:
    env = environment(dict(os.environ))
    if env.get("SPARK_AUTH_SECRET_FILE"):
        conf_dir = Path(env["SPARK_CONF_DIR"])
        conf_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = conf_dir / "spark-defaults.conf"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(spark_defaults(secret(env["SPARK_AUTH_SECRET_FILE"])))
        os.chmod(target, 0o600)
    os.umask(0o002)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main(sys.argv[1:])
