"""How the streaming job is launched: the spark-submit command line and the Spark settings it carries.

`submit_spec` is the one description of a launch; `submit_argv` turns it into a command line for the CLI, and
the deploy DAG hands the same spec to the Spark provider's SparkSubmitHook.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from onceflow import resources
from onceflow.config import ENV_PREFIX, INSTANCE_PREFIX, STANDALONE_SCHEME, ConfigError, Settings
from onceflow.runtime import app_jars, class_data, jvm, local_fs

# what spark-submit runs: files of the package (onceflow.entrypoints), found without a checkout
PACKAGE = Path(__file__).resolve().parents[1]
ENTRYPOINTS = PACKAGE / "entrypoints"
JOB_SCRIPT = ENTRYPOINTS / "stream.py"
RECONCILE_SCRIPT = ENTRYPOINTS / "reconcile.py"
BACKFILL_SCRIPT = ENTRYPOINTS / "backfill.py"
LOG4J = resources.LOG4J
# Spark's checkpoint file manager for checkpoints on the local file system (checkpoint_conf).
LOCAL_CHECKPOINT_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def spark_conf(settings: Settings) -> dict[str, str]:
    """Settings the exactly-once protocol depends on are set explicitly, never left to defaults."""
    return {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        # Spark's own checkpoint retention: offsets/, commits/ and state versions of this many batches.
        "spark.sql.streaming.minBatchesToRetain": str(settings.min_batches_to_retain),
        "spark.sql.streaming.stateStore.providerClass": settings.state_store_provider,
        "spark.speculation": "false",
        # Emit windows when the watermark passes them even if no new data arrives.
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
        "spark.sql.adaptive.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.sql.streaming.stopTimeout": "60s",
        "spark.driver.extraJavaOptions": conf_java_log(settings),
        **executor_java_options(settings),
        **checkpoint_conf(settings.checkpoint),
        **with_class_data(settings, local_fs_conf(settings, settings.checkpoint)),
        # With close-out batches the job paces batches itself under a 0 trigger; when a paced batch finds no
        # new input Spark polls the source at this interval (its default, 10 ms, would poll Kafka 100 times/s).
        "spark.sql.streaming.pollingDelay": f"{poll_delay_ms(settings)}ms",
        **driver_bind_conf(settings),
    }


def checkpoint_conf(uri: str) -> dict[str, str]:
    """For a checkpoint on the local file system (`file:`), Spark's FileSystem-based checkpoint file manager instead
    of its default, Hadoop's FileContext: without Hadoop's native library, FileContext forks `readlink` to check a
    rename's target and `chmod` after each create. Measured on the job at 200 records/s (Java Flight Recorder,
    120 s): 3,003 processes started, 25 a second, for the offsets, commits and state files. On a local file system
    both managers check the target, then rename: neither is more atomic there. HDFS and object stores keep Spark's
    default."""
    if not uri.startswith("file:"):
        return {}
    return {"spark.sql.streaming.checkpointFileManagerClass": LOCAL_CHECKPOINT_MANAGER}


def local_fs_conf(settings: Settings, uri: str) -> dict[str, str]:
    """For a checkpoint on this machine's file system, written by a driver and executors that run here: Hadoop's local
    file system without a forked `chmod` per file (onceflow.runtime.local_fs). For spark-submit's command line only:
    an in-process session's JVM may already run without the class on its class path."""
    if not uri.startswith("file:"):
        return {}
    return local_fs.conf(settings, executors_here=_executors_on_this_machine(settings.master))


def with_class_data(settings: Settings, fs_conf: dict[str, str]) -> dict[str, str]:
    """`fs_conf` (the local file system's settings of a launch), plus the options that map the class-data archive
    (onceflow.runtime.class_data, ONCEFLOW_CLASS_DATA_SHARING) on the driver and on executors that run here: only
    where the launch's class path is the one the archive was dumped with (a JVM ignores an archive of another class
    path, with a warning in its log). A launch without the local file system's jar before Spark's (a checkpoint
    elsewhere, or no javac here) goes without: the archive is dumped with it first, and the jar is not built for a
    launch that does not use it."""
    if not settings.class_data_sharing or not _executors_on_this_machine(settings.master):
        return fs_conf
    launch_path = fs_conf.get("spark.driver.extraClassPath")
    if launch_path is None or launch_path != class_data.driver_class_path(settings):
        return fs_conf
    archive = class_data.build(settings, spark_submit(), submit_env(settings))  # on first use: a minute or two, once
    if archive is None:
        return fs_conf
    opts = f"-XX:SharedArchiveFile={archive}"
    return {
        **fs_conf,
        "spark.driver.extraJavaOptions": f"{conf_java_log(settings)} {opts}",
        **executor_java_options(settings, opts),
    }


def driver_bind_conf(settings: Settings) -> dict[str, str]:
    """Where a driver launched here listens: its RPC endpoint and its block manager (the only ports a driver opens
    with the UI off; pyspark's py4j gateway and Python workers are on loopback by pyspark's own doing). When every
    executor runs on this machine too, in local mode or on a standalone master at a loopback address (the embedded
    cluster), they bind the embedded stack's listen address (ONCEFLOW_LISTEN_HOST): loopback unless it opens them.
    On any other cluster Spark's defaults stay (the driver binds and advertises this host's address): executors on
    other machines must reach the driver, which a loopback address would make impossible; there the cluster's
    network, not onceflow, decides who reaches the driver."""
    import ipaddress

    if not _executors_on_this_machine(settings.master):
        return {}
    if ipaddress.ip_address(settings.listen_host).is_unspecified:
        return {"spark.driver.bindAddress": settings.listen_host}  # every interface; advertised: Spark's default
    return {"spark.driver.host": settings.listen_host, "spark.driver.bindAddress": settings.listen_host}


def _executors_on_this_machine(master: str) -> bool:
    """local[...], or spark:// with every master (HA: host:port,host:port) at a loopback address."""
    import ipaddress

    if master == "local" or master.startswith("local["):
        return True
    if not master.startswith(STANDALONE_SCHEME):
        return False
    for hostport in master[len(STANDALONE_SCHEME) :].split(","):
        host = hostport.rsplit(":", 1)[0].strip("[]")
        if host != "localhost":
            try:
                if not ipaddress.ip_address(host).is_loopback:
                    return False
            except ValueError:
                return False  # a host name: some machine's
    return True


def poll_delay_ms(settings: Settings) -> int:
    return max(50, min(500, int(settings.trigger_interval_s * 100)))


def submit_spec(settings: Settings) -> dict:
    """The one description of the job's launch, for spark-submit (`submit_argv`) and the Spark provider's
    SparkSubmitHook alike: name, jars, memory, Spark conf, and `application` (the job's script, as the place where
    the driver runs sees it). Local mode, a standalone cluster (client mode) and Kubernetes (client or cluster
    mode) differ only here."""
    conf = spark_conf(settings)
    if settings.on_standalone and settings.cores_max > 0:
        conf["spark.cores.max"] = str(settings.cores_max)  # leave cores for the recount and backfills
    return _spec(settings, f"onceflow-{settings.app_id}", conf, JOB_SCRIPT)


def session_jars(settings: Settings) -> list[Path]:
    """Every jar a Spark session of the app needs beside pyspark's own: Spark's Kafka connector and the app's JVM
    functions (onceflow.runtime.app_jars)."""
    return [*jvm.spark_kafka_jars(settings), *app_jars.jars(settings)]


def _spec(settings: Settings, name: str, conf: dict[str, str], script: Path) -> dict:
    in_cluster = settings.deploy_mode == "cluster"
    jars = [str(j) for j in session_jars(settings)]
    spec: dict = {
        "name": name,
        "jars": ",".join(_in_image(settings, j) if in_cluster else j for j in jars),
        "driver_memory": settings.driver_memory,
        "conf": dict(conf),
        "application": _in_image(settings, str(script)) if in_cluster else str(script),
    }
    if not settings.master.startswith("local"):
        spec["executor_memory"] = settings.executor_memory
        spec["executor_cores"] = settings.executor_cores
    if settings.master.startswith("k8s://"):
        spec["conf"] |= kubernetes_conf(settings)
    return spec


def _in_image(settings: Settings, path: str) -> str:
    """A file a launch needs, as a driver pod sees it (local://): the package's files under
    `<app_root_in_image>/include/onceflow`, the resolved jars under `<app_root_in_image>/var/jvm` (docker/ builds the
    image so). Where this package is installed here (a checkout, a wheel) plays no part."""
    root = Path(settings.app_root_in_image.rstrip("/") or "/")
    where = Path(os.path.abspath(path))  # not resolve(): the jvm dir may be a symlink
    for base, in_pod in (
        (PACKAGE, root / "include" / "onceflow"),
        (Path(os.path.abspath(settings.jvm_dir)), root / "var" / "jvm"),
    ):
        for p in (where, where.resolve()):
            if p.is_relative_to(base):
                return f"local://{(in_pod / p.relative_to(base)).as_posix()}"
    raise ConfigError(f"{path} is neither the onceflow package's nor a jar of ONCEFLOW_JVM_DIR: no image holds it")


def kubernetes_conf(settings: Settings) -> dict[str, str]:
    """Spark on Kubernetes: the image, the namespace, the driver's service account; the onceflow settings reach a
    driver pod as its environment (secrets never: they come from Kubernetes secrets, see docs/cluster.md)."""
    conf = {
        "spark.kubernetes.container.image": settings.k8s_image,
        "spark.kubernetes.namespace": settings.k8s_namespace,
        "spark.kubernetes.authenticate.driver.serviceAccountName": settings.k8s_service_account,
        # the job is long-lived: the submitting task must not wait for it (the deploy DAG tracks it by events)
        "spark.kubernetes.submission.waitAppCompletion": "false",
    }
    if settings.deploy_mode == "cluster":
        in_pod = settings.replace(
            var_dir=Path(settings.app_root_in_image) / "var", jvm_dir=Path(settings.app_root_in_image) / "var" / "jvm"
        )
        if settings.secured:
            secret, mount = settings.k8s_kafka_secret, settings.k8s_kafka_secret_mount
            in_pod = in_pod.replace(kafka_ca_file=f"{mount}/ca.pem")
            conf[f"spark.kubernetes.driver.secretKeyRef.{ENV_PREFIX}KAFKA_PASSWORD"] = f"{secret}:password"
            # the executors' Kafka consumers read the CA from the same path (the jaas config comes with the plan)
            conf[f"spark.kubernetes.driver.secrets.{secret}"] = mount
            conf[f"spark.kubernetes.executor.secrets.{secret}"] = mount
        # never the password: the command carries every driverEnv (on a secured cluster, secretKeyRef sets it)
        image_env = {k: v for k, v in in_pod.as_env().items() if k != f"{ENV_PREFIX}KAFKA_PASSWORD"}
        conf |= {f"spark.kubernetes.driverEnv.{k}": v for k, v in sorted(image_env.items())}
        conf["spark.driver.extraJavaOptions"] = conf_java_log(settings, in_image=True)
    return conf


# A stop-the-world collector also takes a full collection each time the classes' metadata passes a threshold the JVM
# starts at about 21 MB and raises as it goes; a driver holds about 55 MB after its first minutes, so its first
# thresholds fell on batches (docs/performance.md, "Full collections between batches"). 128 MB: none after the start.
STOP_THE_WORLD_METASPACE = "-XX:MetaspaceSize=128m"
GC_OPTIONS = {
    "parallel": f"-XX:+UseParallelGC {STOP_THE_WORLD_METASPACE}",
    "serial": f"-XX:+UseSerialGC {STOP_THE_WORLD_METASPACE}",
    "g1": "-XX:+UseG1GC",
    "jvm": "",
}


def tuning_options(settings: Settings) -> list[str]:
    """What every Spark JVM of the platform gets, driver and executors alike: its garbage collector (Settings.jvm_gc)
    and the JIT's options (Settings.jit_options); empty where either is left to the JVM."""
    return [o for o in (GC_OPTIONS[settings.jvm_gc], settings.jit_options) if o]


def conf_java_log(settings: Settings, in_image: bool = False) -> str:
    """The driver JVM's options: its log configuration, exit on OutOfMemoryError, its garbage collector
    (Settings.jvm_gc) and the JIT's (Settings.jit_options). A driver JVM out of heap otherwise lives on with a dead
    thread (a task-result getter) and the query waits for good; exiting makes it a failure the supervisor restarts
    and counts."""
    path = _in_image(settings, str(LOG4J)).removeprefix("local://") if in_image else str(LOG4J)
    return " ".join([f"-Dlog4j2.configurationFile=file:{path} -XX:+ExitOnOutOfMemoryError", *tuning_options(settings)])


def executor_java_options(settings: Settings, *more: str) -> dict[str, str]:
    """The executors' JVM options (where Spark starts them: a cluster; local mode runs them in the driver's JVM): the
    garbage collector's and the JIT's, then `more`."""
    opts = " ".join(filter(None, [*tuning_options(settings), *more]))
    return {"spark.executor.extraJavaOptions": opts} if opts else {}


def spark_submit() -> str:
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else (shutil.which("spark-submit") or "spark-submit")


# What a Spark child (the streaming job, a backfill, a recount, a standalone master or worker) takes from the
# environment of whoever launches it. An allow-list: Airflow's processes hold every role's Kafka connection
# (AIRFLOW_CONN_*) and Airflow's own keys (AIRFLOW__*), none of which a child may see; each child gets its own role's
# settings (Settings.as_env: its own credential only) and what the OS, the JVM, Spark, Hadoop and cloud storage need.
CHILD_ENV_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "HOSTNAME",
        "TERM",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "LD_LIBRARY_PATH",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "KUBECONFIG",
        "PYTEST_ONCEFLOW_SESSION",  # the test suite's mark on the processes it started (tests/conftest.py)
    }
)
CHILD_ENV_PREFIXES = ("LC_", "ONCEFLOW_", "SPARK_", "PYSPARK_", "JAVA_", "_JAVA_", "JDK_", "HADOOP_", "YARN_", "AWS_")


def child_env(settings: Settings, parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process of `settings`' role: the allow-listed part of `parent` (this process's
    environment by default), then the role's own settings over it."""
    parent = os.environ if parent is None else parent
    kept = {
        k: v
        for k, v in parent.items()
        if (k in CHILD_ENV_NAMES or k.startswith(CHILD_ENV_PREFIXES))
        and not _another_roles_secret(k)
        # ONCEFLOW__<INSTANCE>__*: resolved into the settings below, one instance's, as the parent has them
        and not k.startswith(INSTANCE_PREFIX)
    }
    return {**kept, **settings.as_env()}


def _another_roles_secret(name: str) -> bool:
    """An onceflow variable holding a secret the settings did not give this child (ONCEFLOW_KAFKA_PASSWORD comes
    from the role's own settings; ONCEFLOW_KAFKA_<ROLE>_PASSWORD are an admin's, for provisioning)."""
    return name.startswith("ONCEFLOW_") and any(w in name for w in ("PASSWORD", "SECRET", "TOKEN"))


def submit_env(settings: Settings) -> dict[str, str]:
    """The environment spark-submit needs to find this interpreter's pyspark, wherever it is called from: the
    role's own (child_env), never the launcher's other secrets."""
    import pyspark

    bin_dir = str(Path(sys.executable).parent)
    return {
        **child_env(settings),
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
    }


def submit_argv(settings: Settings) -> list[str]:
    return spec_argv(settings, submit_spec(settings))


def spec_argv(settings: Settings, spec: dict, args: list[str] | None = None) -> list[str]:
    """A launch spec as a spark-submit command line."""
    argv = [
        spark_submit(),
        "--master",
        settings.master,
        "--deploy-mode",
        settings.deploy_mode,
        "--name",
        spec["name"],
        "--jars",
        spec["jars"],
        "--driver-memory",
        spec["driver_memory"],
    ]
    if "executor_memory" in spec:
        argv += ["--executor-memory", spec["executor_memory"], "--executor-cores", str(spec["executor_cores"])]
    for k, v in spec["conf"].items():
        argv += ["--conf", f"{k}={v}"]
    return argv + [spec["application"], *(args or [])]


def batch_conf(settings: Settings) -> dict[str, str]:
    """Spark settings of the batch jobs (reconciliation recount, backfill)."""
    return {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": conf_java_log(settings),
        **executor_java_options(settings),
        # the replay's streaming checkpoint lives under var/ (onceflow.operations.replay)
        **checkpoint_conf(settings.var_dir.as_uri()),
        **driver_bind_conf(settings),
    }


def batch_spec(settings: Settings, name: str, script: Path | None = None) -> dict:
    """The launch spec of a batch job (the reconciliation recount, a backfill): `script` of onceflow.entrypoints."""
    return _spec(
        settings,
        f"onceflow-{settings.app_id}-{name}",
        batch_conf(settings) | with_class_data(settings, local_fs_conf(settings, settings.var_dir.as_uri())),
        script or ENTRYPOINTS / f"{name}.py",
    )


def local_session(settings: Settings, name: str, log_file: Path | None = None):
    """An in-process SparkSession for the batch jobs, with the Kafka connector (CLI, tests). With `log_file`, the
    driver JVM's own output (its stderr, where log4j writes) goes there instead of the terminal."""
    import contextlib
    import os

    from pyspark.sql import SparkSession

    b = SparkSession.builder.master(settings.master).appName(f"onceflow-{settings.app_id}-{name}")
    b = b.config("spark.jars", ",".join(str(j) for j in session_jars(settings)))
    for k, v in batch_conf(settings).items():
        if k != "spark.driver.extraJavaOptions":
            b = b.config(k, v)
    if log_file is None:
        return b.getOrCreate()

    @contextlib.contextmanager
    def stderr_to(path: Path):
        # The gateway JVM inherits file descriptor 2 when it is spawned: point it at the log file for that moment.
        path.parent.mkdir(parents=True, exist_ok=True)
        sys.stderr.flush()
        saved = os.dup(2)
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)

    with stderr_to(log_file):
        spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
