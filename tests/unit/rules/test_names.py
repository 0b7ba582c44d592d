"""The Kafka names of an app: built in one place (onceflow.rules.names), stable (a renamed group or transactional
id would orphan an app's position and fencing, a renamed principal its ACLs), and the ACLs grant exactly them."""

from onceflow import config
from onceflow.kafka import acls
from onceflow.operations import backfill, recon_chain
from onceflow.rules import names


def test_an_apps_names_are_the_ones_its_history_was_written_with():
    s = config.load(env={}, app_id="shop")
    assert (s.source_topic, s.sink_topic, s.dlq_topic, s.ledger_topic, s.job_events_topic, s.backfill_topic) == (
        "shop_source",
        "shop_sink",
        "shop_dlq",
        "shop_ledger",
        "shop_events",
        "shop_backfill",
    )
    assert (s.events_topic, s.alerts_topic, s.health_topic, s.reconciliation_topic) == (
        "onceflow_events",
        "onceflow_alerts",
        "onceflow_health",
        "onceflow_reconciliation",
    )
    assert s.transactional_id == s.group_id == "onceflow.shop"
    assert s.reader_group == "onceflow.reader.shop"
    assert names.ledger_group("shop") == "onceflow.shop.ledger"
    assert backfill.transactional_id(s, "b1") == backfill.group_id(s, "b1") == "onceflow.shop.backfill.b1"
    assert recon_chain.group_id(s) == recon_chain.transactional_id(s) == "onceflow.shop.reconciliation"
    assert acls.username(s, "job") == "onceflow.shop.job"


def test_an_instance_is_named_from_its_app_id_and_a_setting_still_names_its_own_topic():
    s = config.load(env={"ONCEFLOW_APP_ID": "ip_count_eu", "ONCEFLOW_SINK_TOPIC": "eu.counts"})
    assert s.app == "ip_count"
    assert s.source_topic == "ip_count_eu_source"
    assert s.sink_topic == "eu.counts"


def _granted(s, role, resource):
    return [(a.name, a.pattern) for a in acls.required(s, role) if a.resource == resource]


def _covers(granted, name):
    return any(n == name if p == "LITERAL" else name.startswith(n) for n, p in granted)


def test_every_group_and_transactional_id_the_code_uses_is_granted_to_the_role_that_uses_it():
    s = config.load(env={}, app_id="shop")
    uses = {
        "job": {
            "GROUP": [s.group_id, names.ledger_group("shop"), s.reader_group, names.spark_group_prefix("shop") + ".x"],
            "TRANSACTIONAL_ID": [s.transactional_id],
        },
        "backfill": {
            "GROUP": [backfill.group_id(s, "b1"), s.reader_group],
            "TRANSACTIONAL_ID": [backfill.transactional_id(s, "b1")],
        },
        "reconcile": {"GROUP": [recon_chain.group_id(s)], "TRANSACTIONAL_ID": [recon_chain.transactional_id(s)]},
        "control": {"GROUP": [names.txn_watch_group("shop"), s.reader_group], "TRANSACTIONAL_ID": []},
    }
    for role, by_resource in uses.items():
        for resource, used in by_resource.items():
            granted = _granted(s, role, resource)
            for name in used:
                assert _covers(granted, name), (role, resource, name, granted)
    # and nothing of another app
    other = config.load(env={}, app_id="shopx")
    for role in acls.ROLES:
        for resource in ("GROUP", "TRANSACTIONAL_ID"):
            for name, pattern in _granted(s, role, resource):
                if pattern == "PREFIXED":
                    assert not other.transactional_id.startswith(name) and not other.group_id.startswith(name), name


def test_an_app_id_cannot_reach_under_another_apps_prefixes():
    import pytest

    with pytest.raises(config.ConfigError, match="APP_ID"):
        config.load(env={}, app_id="shop.backfill.x")  # would be covered by app shop's backfill prefix


def test_a_runs_private_topics_name_every_topic_setting_and_none_of_the_platforms():
    """A test's, the bench's, chaos's or the soak's app has a topic of its own for every topic setting, so a run
    never reads or writes a platform-wide topic."""
    fields = {f for f in config.Settings.__dataclass_fields__ if f.endswith("_topic")}
    assert set(names.private_topics("x")) == fields == set(config.TOPIC_FIELDS)
    s = config.load(env={}).replace(app_id="x", **names.private_topics("x"))  # valid settings
    own = {getattr(s, f) for f in fields}
    assert len(own) == len(fields) and all(n.startswith("x.") for n in own)
    key = names.kafka_collision_key
    assert not {key(n) for n in own} & {key(n) for n in names.SHARED_TOPICS.values()}


def test_no_two_app_ids_private_topics_collide_as_kafka_compares_names():
    """Kafka refuses a topic whose name equals another's with '.' and '_' taken for one character: the tools' old
    `x.job_events` collided with app `x_job`'s `x_job.events`. App ids hold letters, digits, '_' and '-'."""
    apps = ("x", "x_job", "x_job_events", "x-job", "x_job-events", "a_b", "a-b", "chaos", "soak", "topo", "topo_faults")
    for app in apps:
        config.load(env={}, app_id=app)  # each a valid app id
    seen: dict[str, str] = {}
    for app in apps:
        for name in names.private_topics(app).values():
            key = names.kafka_collision_key(name)
            assert seen.setdefault(key, name) == name, (name, seen[key])
    # why: no suffix holds a character Kafka folds, and an app id holds no '.'
    assert not any(c in suffix for suffix in names.PRIVATE_TOPICS.values() for c in "._")
