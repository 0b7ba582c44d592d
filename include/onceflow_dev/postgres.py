"""The embedded Airflow's metadata database: Debian's PostgreSQL server, run from its own binaries with its data
under var/ (a cluster of its own: `initdb`, `pg_ctl`), on a loopback TCP port and no Unix socket, with a password
(SCRAM) that only Airflow's processes get, in the connection string of their environment.

PostgreSQL refuses to run as root. Run as root (a container, CI), the server runs as the system user `postgres`
that Debian's package creates; when that user cannot reach var/ (a checkout under /root, mode 0700), the data goes
to a directory of its own under /var/tmp and var/postgres links to it, so every command still finds it there."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

from onceflow.config import Settings
from onceflow.runtime import procs
from onceflow.wire import OnceflowError
from onceflow_dev.private_files import write_private

DATABASE, USER = "airflow", "airflow"
SERVICE_USER = "postgres"  # the account Debian's postgresql package creates


class PostgresError(OnceflowError):
    pass


def bin_dir() -> Path:
    """The newest installed server's binaries (Debian: /usr/lib/postgresql/<version>/bin), or the PATH's."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name.split(".")[0])
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresError(
        "no PostgreSQL server is installed (initdb not found): install Debian's `postgresql` package "
        "(.ci/run does), or set ONCEFLOW_AIRFLOW_DB=sqlite"
    )


def _as_root() -> bool:
    return os.geteuid() == 0


def _run_as() -> list[str]:
    return ["runuser", "-u", SERVICE_USER, "--"] if _as_root() else []


def _service_can_reach(path: Path) -> bool:
    if not _as_root():
        return True
    return subprocess.run([*_run_as(), "test", "-x", str(path)], capture_output=True).returncode == 0


def home(s: Settings) -> Path:
    """var/postgres: the cluster's files, or a link to them (module docstring)."""
    return s.var_dir / "postgres"


def _state(s: Settings) -> Path:
    return s.var_dir / "postgres.json"  # the port and the password: read by whoever starts Airflow; 0600


def _data(s: Settings) -> Path:
    return home(s).resolve() / "data"  # resolved: the server's user may not reach var/ itself (the link)


def _place(s: Settings) -> None:
    """Make var/postgres, where the server's user can reach it."""
    h = home(s)
    if h.exists() or h.is_symlink():
        return
    s.var_dir.mkdir(parents=True, exist_ok=True)
    if _service_can_reach(s.var_dir.resolve()):
        h.mkdir()
    else:
        tag = hashlib.sha1(str(s.var_dir.resolve()).encode()).hexdigest()[:12]
        elsewhere = Path("/var/tmp") / f"onceflow-postgres-{tag}"
        elsewhere.mkdir(mode=0o700, exist_ok=True)
        h.symlink_to(elsewhere)
    if _as_root():
        shutil.chown(h.resolve(), SERVICE_USER, SERVICE_USER)
        os.chmod(h.resolve(), 0o700)


def state(s: Settings) -> dict | None:
    try:
        return dict(json.loads(_state(s).read_text()))
    except (OSError, ValueError):
        return None


def _server_env() -> dict[str, str]:
    """The server's environment: the system's basics only (launcher.CHILD_ENV_NAMES, locale), none of the caller's
    settings or credentials: it holds no Kafka role, and its own password is in its data, not its environment."""
    from onceflow.runtime.launcher import CHILD_ENV_NAMES

    return {k: v for k, v in os.environ.items() if k in CHILD_ENV_NAMES or k.startswith("LC_")}


def _pg(s: Settings, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [*_run_as(), str(bin_dir() / tool), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env=_server_env(),
    )
    if out.returncode != 0:
        raise PostgresError(
            f"{tool} {' '.join(args)} failed ({out.returncode}):\n{out.stdout[-1500:]}{out.stderr[-1500:]}"
        )
    return out


def _init(s: Settings) -> dict:
    """A new cluster: its superuser `airflow` with a fresh password, loopback only, no Unix socket."""
    _place(s)
    password, port = secrets.token_urlsafe(18), procs.free_port()
    pwfile = home(s).resolve() / ".pwfile"
    write_private(pwfile, password + "\n")
    try:
        if _as_root():
            shutil.chown(pwfile, SERVICE_USER, SERVICE_USER)
        _pg(
            s,
            "initdb",
            "-D",
            str(_data(s)),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-instructions",
        )
    finally:
        pwfile.unlink(missing_ok=True)
    conf = _data(s) / "postgresql.auto.conf"
    with open(conf, "a") as f:
        f.write(f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = ''\n")
    info = {"port": port, "password": password, "user": USER, "database": DATABASE}
    write_private(_state(s), json.dumps(info))
    return info


def running(s: Settings) -> bool:
    return server_pid(s) is not None


def up(s: Settings, timeout: float = 60) -> str:
    """Start the server (initialised on first use) and return Airflow's connection string (SQL_ALCHEMY_CONN)."""
    info = state(s)
    if info is None or not (_data(s) / "PG_VERSION").exists():
        info = _init(s)
        fresh = True
    else:
        fresh = False
    if not running(s):
        log = home(s).resolve() / "server.log"  # the server's user writes it
        _pg(s, "pg_ctl", "-D", str(_data(s)), "-l", str(log), "-w", "-t", str(int(timeout)), "start")
    url = url_for(info)
    if fresh:
        _create_database(info, timeout)
    return url


def url_for(info: dict, database: str | None = None) -> str:
    return f"postgresql+psycopg2://{info['user']}:{info['password']}@127.0.0.1:{info['port']}/{database or info['database']}"


def _create_database(info: dict, timeout: float) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg2.connect(
                host="127.0.0.1", port=info["port"], user=info["user"], password=info["password"], dbname="postgres"
            )
            break
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {info['database']}")
    finally:
        conn.close()


def sql_alchemy_conn(s: Settings) -> str | None:
    """Airflow's connection string when its database is the embedded PostgreSQL and it was set up; else None."""
    info = state(s) if s.airflow_db == "postgres" else None
    return url_for(info) if info else None


def down(s: Settings, timeout: float = 60) -> bool:
    """Stop the server (fast: rolls back open transactions). True if it ran."""
    if not running(s):
        return False
    _pg(s, "pg_ctl", "-D", str(_data(s)), "-m", "fast", "-w", "-t", str(int(timeout)), "stop")
    return True


def server_pid(s: Settings) -> int | None:
    try:
        pid = int((_data(s) / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if procs.pid_alive(pid) else None


def remove(s: Settings) -> None:
    """Stop the server and delete its cluster (a test's throwaway var/, or a reset)."""
    down(s)
    target = home(s).resolve()
    if home(s).is_symlink():
        home(s).unlink()
    shutil.rmtree(target, ignore_errors=True)
    _state(s).unlink(missing_ok=True)


def dump_text(s: Settings) -> str:
    """Every row of every table of Airflow's database as text (what a test greps for secrets)."""
    import psycopg2

    info = state(s)
    if info is None:
        return ""
    conn = psycopg2.connect(
        host="127.0.0.1", port=info["port"], user=info["user"], password=info["password"], dbname=info["database"]
    )
    out = []
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            for (table,) in cur.fetchall():
                cur.execute(f'SELECT t::text FROM "{table}" t')
                out += [row[0] for row in cur.fetchall()]
    finally:
        conn.close()
    return "\n".join(out)


def query(s: Settings, sql: str) -> list[tuple]:
    import psycopg2

    info = state(s)
    if info is None:
        raise PostgresError("the embedded PostgreSQL was never set up (onceflow-dev airflow up does it)")
    conn = psycopg2.connect(
        host="127.0.0.1", port=info["port"], user=info["user"], password=info["password"], dbname=info["database"]
    )
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


# ---------------------------------------------------------------------------- the PostgreSQL sink's database
def serves_sinks(s: Settings) -> bool:
    """Was the server provisioned as apps' sink database (provision_sink), besides Airflow's?"""
    return bool((state(s) or {}).get("roles"))


def sink_settings(s: Settings, purpose: str = "job") -> Settings:
    """`s` pointed at the embedded server's sink database (s.postgres_database) as the app's role for `purpose`
    (job: writes its tables; reader: reads them), with the password made for it by provision_sink."""
    from onceflow.rules import names

    info = state(s)
    if info is None or not running(s):
        raise PostgresError("the embedded PostgreSQL is not running: onceflow-dev stack up --postgres starts it")
    role = names.db_role(s.app_id, purpose)
    password = info.get("roles", {}).get(role)
    if password is None:
        raise PostgresError(
            f"role {role} was never made: onceflow-dev stack up --postgres provisions the app's database"
        )
    return s.replace(
        sink_kind="postgres",
        postgres_host="127.0.0.1",
        postgres_port=int(info["port"]),
        postgres_user=role,
        postgres_password=password,
    )


def provision_sink(s: Settings, timeout: float = 60) -> Settings:
    """Start the server if needed, create the sink's database, the app's job and reader roles (scram-sha-256
    passwords kept in var/postgres.json, 0600, as the Kafka ones are in var/kafka/credentials.json) and its schema
    and tables (onceflow.database.schema). Returns `s` as the job's role."""
    import psycopg

    from onceflow.database import schema
    from onceflow.rules import names

    up(s, timeout)
    info = dict(state(s) or {})
    roles = dict(info.get("roles", {}))
    wanted = [names.db_role(s.app_id, p) for p in ("job", "reader")]
    roles |= {r: secrets.token_urlsafe(18) for r in wanted if r not in roles}
    info["roles"] = roles
    write_private(_state(s), json.dumps(info))
    admin = dict(host="127.0.0.1", port=info["port"], user=info["user"], password=info["password"])
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = psycopg.connect(**admin, dbname="postgres", autocommit=True)
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with conn:
        schema.ensure_database(conn, s.postgres_database)
        for role in wanted:
            schema.ensure_login_role(conn, role, roles[role])
    with psycopg.connect(**admin, dbname=s.postgres_database) as conn:
        schema.provision(conn, s.database_schema, wanted[0], wanted[1])
    return sink_settings(s)


def crash_restart(s: Settings, timeout: float = 60, down_s: float = 0.0) -> None:
    """Stop the server as a crash would (immediate: no checkpoint, every session cut, open transactions lost), leave
    it down `down_s` seconds and start it again: what the sink's tests and `make chaos` do to it mid-batch."""
    log = home(s).resolve() / "server.log"
    _pg(s, "pg_ctl", "-D", str(_data(s)), "-m", "immediate", "-w", "-t", str(int(timeout)), "stop")
    time.sleep(down_s)
    _pg(s, "pg_ctl", "-D", str(_data(s)), "-l", str(log), "-w", "-t", str(int(timeout)), "start")
