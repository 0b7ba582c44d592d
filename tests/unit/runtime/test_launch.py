"""The launch spec: one description of how the job (and the batch jobs) are submitted, in local mode, on a Spark
standalone cluster and on Kubernetes in cluster mode, as spark-submit and as the Spark provider's hook builds it."""

import json
import os

import pytest

from onceflow import config
from onceflow.config import ConfigError
from onceflow.runtime import launcher


def test_local_mode_runs_the_script_of_this_checkout():
    s = config.load(env={})
    spec = launcher.submit_spec(s)
    assert spec["application"] == str(launcher.JOB_SCRIPT) and "executor_memory" not in spec
    argv = launcher.submit_argv(s)
    assert argv[argv.index("--master") + 1] == "local[2]" and argv[argv.index("--deploy-mode") + 1] == "client"
    assert argv[-1] == str(launcher.JOB_SCRIPT) and all(j.endswith(".jar") for j in spec["jars"].split(","))


def test_a_standalone_cluster_gets_its_executors_in_client_mode():
    s = config.load(env={}, master="spark://127.0.0.1:7077", executor_memory="2g", executor_cores=1)
    argv = launcher.submit_argv(s)
    assert argv[argv.index("--executor-memory") + 1] == "2g" and argv[argv.index("--executor-cores") + 1] == "1"
    assert argv[argv.index("--deploy-mode") + 1] == "client"
    assert not any(a.startswith("spark.cores.max=") for a in argv)  # Spark's default: every core
    capped = launcher.submit_argv(s.replace(cores_max=2))
    assert "spark.cores.max=2" in capped
    # the batch jobs (recount, backfill) are short: they take what the streaming job leaves
    assert "spark.cores.max" not in launcher.batch_spec(s.replace(cores_max=2), "reconcile")["conf"]
    with pytest.raises(ConfigError, match="standalone cannot run Python drivers in cluster mode"):
        config.load(env={}, master="spark://127.0.0.1:7077", deploy_mode="cluster")


def _k8s_cluster_mode(**overrides) -> config.Settings:
    return config.load(
        env={},
        master="k8s://https://kube.example:6443",
        deploy_mode="cluster",
        k8s_image="registry.example/onceflow:1.0",
        **overrides,
    )


def test_the_jit_options_go_to_the_drivers_and_executors_jvms_and_can_be_left_to_the_jvm(tmp_path):
    s = config.load(env={}, master="spark://127.0.0.1:7077", var_dir=tmp_path, class_data_sharing=False)
    assert s.jit_options.startswith("-XX:Tier4InvocationThreshold=")
    for conf in (launcher.submit_spec(s)["conf"], launcher.batch_spec(s, "reconcile")["conf"]):
        assert conf["spark.driver.extraJavaOptions"].endswith(s.jit_options)
        assert conf["spark.executor.extraJavaOptions"] == f"-XX:+UseParallelGC -XX:MetaspaceSize=128m {s.jit_options}"
    plain = launcher.submit_spec(s.replace(jit_options="", jvm_gc="jvm"))["conf"]
    assert "Tier4" not in plain["spark.driver.extraJavaOptions"] and "spark.executor.extraJavaOptions" not in plain


@pytest.mark.parametrize(
    ("gc", "flag"), [("parallel", "-XX:+UseParallelGC"), ("serial", "-XX:+UseSerialGC"), ("g1", "-XX:+UseG1GC")]
)
def test_the_garbage_collector_is_chosen_for_the_drivers_and_executors_jvms(tmp_path, gc, flag):
    s = config.load(env={"ONCEFLOW_JVM_GC": gc}, master="spark://127.0.0.1:7077", var_dir=tmp_path)
    for conf in (launcher.submit_spec(s)["conf"], launcher.batch_spec(s, "reconcile")["conf"]):
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            got = conf[key].split()
            assert flag in got and sum(o.startswith("-XX:+Use") and o.endswith("GC") for o in got) == 1
            # a stop-the-world collector's full collection at each metadata threshold: none after the start
            assert ("-XX:MetaspaceSize=128m" in got) == (gc != "g1")
    left = launcher.submit_spec(s.replace(jvm_gc="jvm"))["conf"]
    assert "GC" not in left["spark.driver.extraJavaOptions"].replace("ExitOnOutOfMemoryError", "")


def test_a_garbage_collector_the_platform_does_not_know_is_refused_at_load():
    with pytest.raises(ConfigError, match="JVM_GC"):
        config.load(env={"ONCEFLOW_JVM_GC": "zgc"})


@pytest.mark.parametrize("bad", ["Tier4InvocationThreshold=1", "-Xmx4g", "-XX:", "-XX:+Foo; rm -rf /"])
def test_jit_options_other_than_hotspot_options_are_refused_at_load(bad):
    with pytest.raises(ConfigError, match="JIT_OPTIONS takes HotSpot options"):
        config.load(env={"ONCEFLOW_JIT_OPTIONS": bad})


def test_kubernetes_cluster_mode_runs_the_image_and_carries_the_settings():
    s = _k8s_cluster_mode(k8s_namespace="streaming", bootstrap_servers="kafka-0.kafka:9092,kafka-1.kafka:9092")
    spec = launcher.submit_spec(s)
    assert spec["application"] == "local:///opt/onceflow/include/onceflow/entrypoints/stream.py"
    assert all(j.startswith("local:///opt/onceflow/var/jvm/") for j in spec["jars"].split(","))
    c = spec["conf"]
    assert c["spark.kubernetes.container.image"] == "registry.example/onceflow:1.0"
    assert c["spark.kubernetes.namespace"] == "streaming"
    assert c["spark.kubernetes.submission.waitAppCompletion"] == "false"
    assert c["spark.kubernetes.driverEnv.ONCEFLOW_BOOTSTRAP_SERVERS"] == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    assert c["spark.kubernetes.driverEnv.ONCEFLOW_VAR_DIR"] == "/opt/onceflow/var"
    assert c["spark.driver.extraJavaOptions"] == (
        "-Dlog4j2.configurationFile=file:/opt/onceflow/include/onceflow/resources/log4j2-job.properties"
        f" -XX:+ExitOnOutOfMemoryError -XX:+UseParallelGC -XX:MetaspaceSize=128m {s.jit_options}"
    )
    assert c["spark.executor.extraJavaOptions"] == f"-XX:+UseParallelGC -XX:MetaspaceSize=128m {s.jit_options}"
    batch = launcher.batch_spec(s, "reconcile")
    assert batch["application"] == "local:///opt/onceflow/include/onceflow/entrypoints/reconcile.py"
    with pytest.raises(ConfigError, match="K8S_IMAGE must name the image"):
        config.load(env={}, master="k8s://https://kube.example:6443", deploy_mode="cluster")


def test_kubernetes_cluster_mode_takes_the_kafka_password_from_a_secret_never_the_command():
    s = _k8s_cluster_mode(
        kafka_security_protocol="SASL_SSL",
        kafka_username="onceflow.ip_count.job",
        kafka_password="s3cret-of-the-job",
        k8s_kafka_secret="kafka-job",
    )
    spec = launcher.submit_spec(s)
    c = spec["conf"]
    assert "s3cret-of-the-job" not in json.dumps(spec) + " ".join(launcher.spec_argv(s, spec))
    assert c["spark.kubernetes.driver.secretKeyRef.ONCEFLOW_KAFKA_PASSWORD"] == "kafka-job:password"
    assert c["spark.kubernetes.driver.secrets.kafka-job"] == c["spark.kubernetes.executor.secrets.kafka-job"]
    assert c["spark.kubernetes.driverEnv.ONCEFLOW_KAFKA_CA_FILE"] == "/etc/onceflow/kafka/ca.pem"
    assert c["spark.kubernetes.driverEnv.ONCEFLOW_KAFKA_USERNAME"] == "onceflow.ip_count.job"
    assert "spark.kubernetes.driverEnv.ONCEFLOW_KAFKA_PASSWORD" not in c


def test_the_spark_providers_hook_builds_the_same_command_from_its_connection(monkeypatch):
    """The deploy DAG's command: the Spark provider's SparkSubmitHook, the master from its connection, the rest
    from the launch spec. (For a k8s:// connection the hook also needs the cncf.kubernetes provider installed,
    which the Kubernetes image adds: docs/cluster.md.)"""
    from onceflow.control import orchestration

    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_CLUSTER", json.dumps({"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077})
    )
    s = config.load(env={}, master="spark://10.0.0.5:7077", executor_memory="3g", spark_conn_id="spark_cluster")
    argv = orchestration.spark_submit_argv(s)
    assert argv[argv.index("--master") + 1] == "spark://10.0.0.5:7077" and argv[-1] == str(launcher.JOB_SCRIPT)
    assert argv[argv.index("--executor-memory") + 1] == "3g"
    assert argv[argv.index("--jars") + 1] == launcher.submit_spec(s)["jars"]
    batch = orchestration.batch_submit_argv(s, launcher.RECONCILE_SCRIPT, ["--chain"])
    assert batch[-2:] == [str(launcher.RECONCILE_SCRIPT), "--chain"]
    assert os.environ["AIRFLOW_CONN_SPARK_CLUSTER"]


def test_a_child_gets_its_own_roles_credential_and_none_of_airflows_secrets(monkeypatch):
    """Airflow's processes hold every role's connection and Airflow's keys; a spark-submit child of one role holds
    that role's settings and what the OS, the JVM and Spark need, nothing else (docs/security.md)."""
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/op",
        "JAVA_HOME": "/usr/lib/jvm/17",
        "LC_ALL": "C.UTF-8",
        "SPARK_CONF_DIR": "/etc/spark",
        "AWS_ACCESS_KEY_ID": "storage",  # the checkpoint's object store: the job's own
        "PYTEST_ONCEFLOW_SESSION": "t1",
        "ONCEFLOW_KAFKA_PASSWORD": "the-launchers-own",
        "ONCEFLOW_KAFKA_BACKFILL_PASSWORD": "provisioning-secret",  # an admin's, for `onceflow kafka provision`
        "AIRFLOW_CONN_ONCEFLOW_KAFKA_BACKFILL": "kafka://backfill:backfill-secret@h:9093",
        "AIRFLOW__CORE__FERNET_KEY": "fernet",
        "AIRFLOW__API_AUTH__JWT_SECRET": "jwt",
        "DATABASE_URL": "postgres://airflow:db-secret@h/airflow",
    }
    for k, v in parent.items():
        monkeypatch.setenv(k, v)
    job = config.load(env={}, kafka_username="onceflow.ip_count.job", kafka_password="job-secret")
    env = launcher.submit_env(job)
    assert env["ONCEFLOW_KAFKA_PASSWORD"] == "job-secret"  # its own, over the launcher's
    for k in ("HOME", "JAVA_HOME", "LC_ALL", "SPARK_CONF_DIR", "AWS_ACCESS_KEY_ID", "PYTEST_ONCEFLOW_SESSION"):
        assert env[k] == parent[k], k
    assert env["PATH"].endswith("/usr/bin")
    leaked = [k for k in env if k.startswith("AIRFLOW") or k == "DATABASE_URL"]
    assert not leaked, leaked
    text = "\n".join(env.values())
    for secret in ("backfill-secret", "fernet", "jwt", "db-secret", "the-launchers-own", "provisioning-secret"):
        assert secret not in text, secret


def test_a_driver_pod_finds_the_packages_files_and_the_jars_wherever_the_package_is_installed_here(
    monkeypatch, tmp_path
):
    """Installed from a wheel (site-packages, jars in the user's cache), a cluster-mode launch names the same places
    in the image as from a checkout: the package's files by their place in the package, the jars by theirs in the
    jvm dir. A file that is neither cannot be in the image and is refused before anything is submitted."""
    site = tmp_path / "lib" / "python3.11" / "site-packages" / "onceflow"
    monkeypatch.setattr(launcher, "PACKAGE", site)
    jvm_dir = tmp_path / "cache" / "onceflow" / "jvm"
    s = _k8s_cluster_mode(jvm_dir=jvm_dir)
    assert launcher._in_image(s, str(site / "entrypoints" / "stream.py")) == (
        "local:///opt/onceflow/include/onceflow/entrypoints/stream.py"
    )
    jar = jvm_dir / "spark-kafka" / "kafka-clients.jar"
    assert launcher._in_image(s, str(jar)) == "local:///opt/onceflow/var/jvm/spark-kafka/kafka-clients.jar"
    with pytest.raises(ConfigError, match="neither the onceflow package's nor a jar"):
        launcher._in_image(s, str(tmp_path / "elsewhere.py"))
