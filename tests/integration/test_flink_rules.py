"""The Flink contender of `make bench` parses like onceflow: its Java rules (jvm/flink-ip-count, Rules.java) agree
with the reference parser record for record on the Spark parser's corpus. Builds the Flink job on first use (Maven
Central, into var/jvm/flink-ip-count), as `make bench` does."""

import pytest

from onceflow import config
from onceflow_apps.access_log import rules as R
from onceflow_dev import bench_flink
from tests.support.records import corpus

pytestmark = pytest.mark.integration


def test_flink_rules_match_reference_on_corpus():
    s = config.load(env={})
    t0 = 1795298400000
    # Kafka timestamps: most a second after the event, some far before it (the timestamp_ahead rule)
    values = [(v, t0 + (10**7 if i % 7 else -(10**8))) for i, v in enumerate(corpus())]
    got = bench_flink.check_rules(s, values)
    want = [R.parse(v, ts, s.max_event_ahead_ms) for v, ts in values]
    mismatches = [(v[:80], g, w) for (v, _), g, w in zip(values, got, want) if g != w]
    assert len(got) == len(values) and not mismatches, mismatches[:10]
    assert R.REASON_TS_AHEAD in {w.reason for w in want}
