import re

import pytest

from onceflow import config, faults
from onceflow.config import ConfigError
from onceflow.kafka import topics


def test_defaults_are_the_embedded_stack():
    s = config.load(env={})
    assert s.bootstrap_servers == "127.0.0.1:9092" and s.source_partitions == 4
    assert s.transactional_id == "onceflow.ip_count" and s.group_id == "onceflow.ip_count"
    assert s.checkpoint.startswith("file://") and s.checkpoint.endswith("/var/checkpoints/ip_count")
    assert (s.restart_attempts, s.restart_delay_s, s.transaction_timeout_ms) == (3, 10.0, 60_000)


def test_environment_overrides_are_typed():
    s = config.load(
        env={
            "ONCEFLOW_SOURCE_PARTITIONS": "8",
            "ONCEFLOW_TRIGGER_INTERVAL_S": "2.5",
            "ONCEFLOW_APP_ID": "x1",
            "ONCEFLOW_CHECKPOINT_URI": "hdfs://nn/cp",
        }
    )
    assert s.source_partitions == 8 and s.trigger_interval_s == 2.5 and s.app_id == "x1"
    assert s.checkpoint == "hdfs://nn/cp" and s.transactional_id == "onceflow.x1"


def test_as_env_roundtrip():
    s = config.load(env={}, app_id="rt", transaction_timeout_ms=1234)
    assert config.load(env=s.as_env()) == s


@pytest.mark.parametrize(
    "env,match",
    [
        ({"ONCEFLOW_SOURCE_PARTITIONS": "four"}, "not a valid int"),
        ({"ONCEFLOW_SOURCE_PARTITIONS": "0"}, "SOURCE_PARTITIONS must be > 0"),
        ({"ONCEFLOW_APP_ID": "a b"}, "APP_ID"),
        ({"ONCEFLOW_STARTING_OFFSETS": "middle"}, "STARTING_OFFSETS"),
        ({"ONCEFLOW_BOOTSTRAP_SERVERS": "nohostport"}, "BOOTSTRAP_SERVERS"),
        ({"ONCEFLOW_MIN_INSYNC_REPLICAS": "2"}, "MIN_INSYNC_REPLICAS"),
        ({"ONCEFLOW_NEAR_TIMEOUT_FRACTION": "1.5"}, "NEAR_TIMEOUT_FRACTION"),
        ({"ONCEFLOW_SINK_KIND": "mysql"}, "SINK_KIND takes kafka or postgres"),
        ({"ONCEFLOW_POSTGRES_PORT": "0"}, "POSTGRES_PORT"),
    ],
)
def test_bad_values_are_rejected_with_the_variable_name(env, match):
    with pytest.raises(ConfigError, match=match):
        config.load(env=env)


def test_transaction_timeout_above_broker_max_says_what_to_change():
    with pytest.raises(ConfigError, match=r"lower ONCEFLOW_TRANSACTION_TIMEOUT_MS to at most 60000"):
        config.load(
            env={"ONCEFLOW_TRANSACTION_TIMEOUT_MS": "120000", "ONCEFLOW_BROKER_TRANSACTION_MAX_TIMEOUT_MS": "60000"}
        )


def test_unknown_override_rejected():
    with pytest.raises(ConfigError, match="unknown"):
        config.load(env={}, nonsense=1)


def test_fault_specs():
    fs = faults.parse("crash_after_commit@3, stall_in_txn@4:2.5")
    assert [(f.point, f.batch, f.seconds) for f in fs] == [("crash_after_commit", 3, 0.0), ("stall_in_txn", 4, 2.5)]
    assert faults.parse("") == []
    for bad in ("explode@1", "crash_after_commit", "stall_in_txn@1", "crash_after_commit@x"):
        with pytest.raises(faults.FaultSpecError):
            faults.parse(bad)


def test_fault_fires_once(tmp_path):
    fired = []
    inj = faults.Injector("stall_in_txn@2:0.01", tmp_path, on_fire=fired.append)
    inj.hit("stall_in_txn", 1)
    inj.hit("stall_in_txn", 2)
    inj.hit("stall_in_txn", 2)
    assert [f.name for f in fired] == ["stall_in_txn@2"]
    # a new injector (the restarted job) sees the marker and does not fire again
    faults.Injector("stall_in_txn@2:0.01", tmp_path, on_fire=fired.append).hit("stall_in_txn", 2)
    assert len(fired) == 1


def test_an_armed_fault_fires_once_per_arming_at_the_batch_that_meets_it(tmp_path):
    fired = []
    inj = faults.Injector("stall_in_txn@armed:0.01", tmp_path, on_fire=fired.append)
    inj.hit("stall_in_txn", 5)  # not armed: nothing
    faults.arm(tmp_path)
    inj.hit("crash_after_commit", 6)  # another point does not take the arming
    inj.hit("stall_in_txn", 6)
    inj.hit("stall_in_txn", 7)
    assert [f.name for f in fired] == ["stall_in_txn@6"]
    faults.arm(tmp_path)
    inj.hit("stall_in_txn", 9)
    assert [f.name for f in fired] == ["stall_in_txn@6", "stall_in_txn@9"]
    with pytest.raises(faults.FaultSpecError, match="only stall_in_txn"):
        faults.parse("crash_after_commit@armed")


def test_a_multi_node_stack_names_every_node_and_replicates_three_ways():
    s = config.load(env={"ONCEFLOW_BROKERS": "3"})
    assert s.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9102,127.0.0.1:9112"
    assert (s.replication_factor, s.min_insync_replicas) == (3, 2)
    assert s.kafka_nodes() == [(1, "127.0.0.1", 9092, 9093), (2, "127.0.0.1", 9102, 9103), (3, "127.0.0.1", 9112, 9113)]
    # what is set stays set
    t = config.load(
        env={
            "ONCEFLOW_BROKERS": "3",
            "ONCEFLOW_MIN_INSYNC_REPLICAS": "1",
            "ONCEFLOW_BOOTSTRAP_SERVERS": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
        }
    )
    assert t.min_insync_replicas == 1 and [n[2] for n in t.kafka_nodes()] == [1, 2, 3]
    with pytest.raises(ConfigError, match="REPLICATION_FACTOR \\(3\\) must be <= ONCEFLOW_BROKERS \\(2\\)"):
        config.load(env={"ONCEFLOW_BROKERS": "2", "ONCEFLOW_REPLICATION_FACTOR": "3"})


def test_the_coordinator_partition_is_kafkas():
    from onceflow.kafka import cluster

    # Java: "onceflow.ip_count".hashCode() and "".hashCode()
    assert cluster.java_string_hash("") == 0
    assert cluster.java_string_hash("a") == 97 and cluster.java_string_hash("ab") == 97 * 31 + 98
    assert cluster.java_string_hash("polygenelubricants") == -(1 << 31)  # Java's Integer.MIN_VALUE case
    assert cluster.coordinator_partition("polygenelubricants", 50) == 0
    assert (
        cluster.coordinator_partition("onceflow.ip_count", 50)
        == abs(cluster.java_string_hash("onceflow.ip_count")) % 50
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"job_events_topic": "onceflow_events"},  # the job's facts on the shared topic any role writes
        {"dlq_topic": "ip_count_sink"},
        {"backfill_topic": "ip_count_ledger"},
        # the same topic to Kafka, which takes '.' and '_' for one character: it would refuse to create the second
        {"dlq_topic": "ip_count.sink"},
        {"job_events_topic": "onceflow.events"},
    ],
)
def test_a_topic_named_by_two_settings_is_refused_at_start(kw):
    ((field, value),) = kw.items()
    with pytest.raises(config.ConfigError, match=re.escape(f"{config.ENV_PREFIX}{field.upper()}={value!r}")):
        config.load(env={}, **kw)


def test_the_airflow_database_is_postgres_or_sqlite():
    assert config.load(env={}).airflow_db == "postgres"
    assert config.load(env={"ONCEFLOW_AIRFLOW_DB": "sqlite"}).airflow_db == "sqlite"
    with pytest.raises(config.ConfigError, match="ONCEFLOW_AIRFLOW_DB takes postgres or sqlite, got 'mysql'"):
        config.load(env={"ONCEFLOW_AIRFLOW_DB": "mysql"})


def test_each_settings_own_rule_is_in_its_type_and_checked_on_load():
    rules = config.field_rules()
    assert rules["sink_kind"].choices == ("kafka", "postgres")
    assert rules["near_timeout_fraction"].describe() == "float in (0, 1)"
    assert rules["batch_job_nice"].describe() == "int in [0, 19]"
    assert rules["postgres_port"].describe() == "int in [1, 65535]"
    with pytest.raises(ConfigError, match=r"ONCEFLOW_DEPLOY_MODE takes client or cluster, got 'both'"):
        config.load(env={"ONCEFLOW_DEPLOY_MODE": "both"})
    with pytest.raises(ConfigError, match=r"ONCEFLOW_BATCH_JOB_NICE must be in \[0, 19\], got 20"):
        config.load(env={"ONCEFLOW_BATCH_JOB_NICE": "20"})
    with pytest.raises(ConfigError, match=r"ONCEFLOW_LATE_FRACTION_THRESHOLD must be in \(0, 1\], got 0.0"):
        config.load(env={"ONCEFLOW_LATE_FRACTION_THRESHOLD": "0"})
    assert config.load(env={"ONCEFLOW_LATE_FRACTION_THRESHOLD": "1"}).late_fraction_threshold == 1.0
    # replace() checks them too, not only load()
    with pytest.raises(ConfigError, match="ONCEFLOW_WATERMARK_S must be >= 0, got -1"):
        config.load(env={}).replace(watermark_s=-1)


def test_the_secret_settings_are_marked_in_their_type_and_redacted():
    secret = {r.name for r in config.field_rules().values() if r.secret}
    assert secret == {"kafka_password", "postgres_password"}
    s = config.load(env={}, kafka_password="k-pw", postgres_password="p-pw")
    d = s.as_dict()
    assert d["kafka_password"] == d["postgres_password"] == "***"
    assert "k-pw" not in repr(s) and "p-pw" not in repr(s)


def test_the_settings_come_in_sections_each_setting_in_exactly_one():
    from dataclasses import fields

    per_section = [{f.name for f in fields(cls)} for cls in config.SECTIONS]
    names = [n for section in per_section for n in section]
    assert sorted(names) == sorted(f.name for f in fields(config.Settings)) and len(names) == len(set(names))
    s = config.load(env={}, bootstrap_servers="10.0.0.1:9092", kafka_password="pw", app_id="orders")
    kafka = s.section(config.KafkaCluster)
    assert type(kafka) is config.KafkaCluster and kafka.bootstrap_servers == "10.0.0.1:9092"
    assert "pw" not in repr(kafka)  # the password is a secret in its section too
    assert s.section(config.Topics).sink_topic == s.sink_topic == "orders_sink"
    with pytest.raises(TypeError, match="not a section"):
        s.section(config.Settings)


def test_an_apps_named_outputs_have_topics_of_their_own_named_from_its_sink_or_given():
    s = config.load(env={}, app="ip_networks")
    assert s.outputs == {"main": "ip_networks_sink", "unlisted": "ip_networks_sink-unlisted"}
    assert s.sink_topics == ("ip_networks_sink", "ip_networks_sink-unlisted")
    given = config.load(env={"ONCEFLOW_OUTPUT_TOPICS": "unlisted=other_networks"}, app="ip_networks")
    assert given.outputs["unlisted"] == "other_networks"
    assert config.load(env={}).outputs == {"main": "ip_count_sink"}  # an app without named outputs: its sink only
    # the shape of its results includes where they go, so a savepoint of one routing is not restored into another
    assert given.job_config_hash() != s.job_config_hash()


def test_an_apps_named_sources_have_topics_of_their_own_named_from_its_source_or_given():
    s = config.load(env={}, app="ip_networks")
    assert s.sources == {"main": "ip_networks_source", "mirror": "ip_networks_source-mirror"}
    assert s.source_topic_list == ["ip_networks_source", "ip_networks_source-mirror"]
    given = config.load(env={"ONCEFLOW_SOURCE_TOPICS": "mirror=eu_access_logs"}, app="ip_networks")
    assert given.sources["mirror"] == "eu_access_logs" and given.source_topic_list[0] == "eu_access_logs"
    assert config.load(env={}).source_topic_list == ["ip_count_source"]  # an app without named sources: its source
    # what it reads is part of the shape of its results: a savepoint of one set of sources is not restored into another
    assert given.job_config_hash() != s.job_config_hash()
    # each source topic is created stamped by the broker, and checked by the job's preflight
    specs = {t.name: t for t in topics.specs(s)}
    for t in s.source_topic_list:
        assert specs[t].config["message.timestamp.type"] == "LogAppendTime" and t in topics.job_topics(s)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ONCEFLOW_SOURCE_TOPICS": "east=x"}, r"names sources app ip_networks does not declare: \['east'\]"),
        ({"ONCEFLOW_SOURCE_TOPICS": "mirror"}, r"ONCEFLOW_SOURCE_TOPICS is name=topic"),
        ({"ONCEFLOW_SOURCE_TOPICS": "mirror=a,mirror=b"}, r"each source once"),
        # a source's topic is a topic like the others: never one another setting names (as Kafka compares names)
        ({"ONCEFLOW_SOURCE_TOPICS": "mirror=ip_networks.sink"}, r"ONCEFLOW_SINK_TOPIC='ip_networks_sink' and "),
    ],
)
def test_named_sources_that_cannot_be_read_are_refused_at_start(env, message):
    with pytest.raises(ConfigError, match=message):
        config.load(env=env, app="ip_networks")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ONCEFLOW_OUTPUT_TOPICS": "rest=x"}, r"names outputs app ip_networks does not declare: \['rest'\]"),
        ({"ONCEFLOW_OUTPUT_TOPICS": "unlisted"}, r"ONCEFLOW_OUTPUT_TOPICS is name=topic"),
        ({"ONCEFLOW_OUTPUT_TOPICS": "unlisted=a,unlisted=b"}, r"each output once"),
        # an output's topic is a topic like the others: never one another setting names (as Kafka compares names)
        ({"ONCEFLOW_OUTPUT_TOPICS": "unlisted=ip_networks.dlq"}, r"ONCEFLOW_DLQ_TOPIC='ip_networks_dlq' and "),
        ({"ONCEFLOW_SINK_KIND": "postgres"}, r"the postgres sink holds one output; set ONCEFLOW_SINK_KIND=kafka"),
    ],
)
def test_named_outputs_that_cannot_be_written_are_refused_at_start(env, message):
    with pytest.raises(ConfigError, match=message):
        config.load(env=env, app="ip_networks")


def test_an_instance_takes_its_own_settings_over_the_environments():
    """ONCEFLOW__<INSTANCE>__<SETTING>: over the plain variable for that instance only, under explicit values; the
    environment's own instance and any other alike."""
    env = {
        "ONCEFLOW_APP_ID": "a",
        "ONCEFLOW_TRIGGER_INTERVAL_S": "2",
        "ONCEFLOW_HEALTH_INTERVAL_S": "30",
        "ONCEFLOW__A__TRIGGER_INTERVAL_S": "3",
        "ONCEFLOW__EU_NETS__TRIGGER_INTERVAL_S": "10",
        "ONCEFLOW__EU_NETS__HEALTH_INTERVAL_S": "300",
        "ONCEFLOW__EU_NETS__ALERT_CHANNELS": "webhook",
        "ONCEFLOW__A__B__TRIGGER_INTERVAL_S": "99",  # instance a__b's, not a setting `b__trigger_interval_s` of a's
    }
    own = config.load(env)
    assert (own.app_id, own.trigger_interval_s, own.health_interval_s) == ("a", 3.0, 30.0)
    assert config.load(env, trigger_interval_s=1).trigger_interval_s == 1.0
    eu = config.load_instance("eu-nets", "ip_networks", env=env)
    assert (eu.trigger_interval_s, eu.health_interval_s, eu.alert_channels) == (10.0, 300.0, "webhook")
    assert config.load_instance("other", "ip_networks", env=env).health_interval_s == 30.0  # the plain one
    assert config.load_instance("a__b", "ip_count", env=env).trigger_interval_s == 99.0


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("ONCEFLOW__A__BOOTSTRAP_SERVERS", "h:1", "a setting of the whole stack or of its identity"),
        ("ONCEFLOW__A__APP", "ip_networks", "a setting of the whole stack or of its identity"),
        ("ONCEFLOW__A__POSTGRES_PASSWORD", "x", "a setting of the whole stack or of its identity"),
        ("ONCEFLOW__A__TRIGGER_INTERVAL", "5", "is not a setting"),
        ("ONCEFLOW__A__TRIGGER_INTERVAL_S", "-1", "TRIGGER_INTERVAL_S"),
    ],
)
def test_a_per_instance_variable_it_may_not_set_is_refused(name, value, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        config.load({"ONCEFLOW_APP_ID": "a", name: value})


def test_per_instance_variables_of_no_instance_and_ids_written_alike_are_refused():
    s = config.load(env={}).replace(apps="a=ip_count, eu-nets=ip_networks")
    assert config.instances(s, env={"ONCEFLOW__EU_NETS__TRIGGER_INTERVAL_S": "1"}) == {
        "a": "ip_count",
        "eu-nets": "ip_networks",
    }
    with pytest.raises(ConfigError, match="ONCEFLOW__EU_NET__TRIGGER_INTERVAL_S names no instance"):
        config.instances(s, env={"ONCEFLOW__EU_NET__TRIGGER_INTERVAL_S": "1"})
    with pytest.raises(ConfigError, match="'eu-nets' and 'eu_nets'"):
        config.instances(s.replace(apps="eu-nets=ip_networks, eu_nets=ip_networks"), env={})


def test_a_child_process_takes_its_instances_settings_resolved_not_the_per_instance_variables():
    from onceflow.runtime import launcher

    parent = {"ONCEFLOW_APP_ID": "a", "ONCEFLOW__A__TRIGGER_INTERVAL_S": "3", "ONCEFLOW__B__TRIGGER_INTERVAL_S": "4"}
    s = config.load(parent, trigger_interval_s=7)  # an explicit value wins over the variable...
    child = launcher.child_env(s, parent)
    assert not [k for k in child if k.startswith("ONCEFLOW__")]
    assert config.load(child).trigger_interval_s == 7.0  # ...and the child runs with what its parent resolved
