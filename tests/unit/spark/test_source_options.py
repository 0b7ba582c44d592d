"""The stream's Kafka source as the job configures it: read_committed, paced, and lookups that follow a moved leader
(Spark's source asks again with a new admin client after a failed lookup, so a short lookup is a short stall)."""

from onceflow import config
from onceflow.spark import app_plan, kafka_source


def test_the_source_reads_committed_records_paced_from_the_apps_topic():
    s = config.load(env={})
    o = app_plan.source_options(s)
    assert o["subscribe"] == s.source_topic and o["kafka.isolation.level"] == "read_committed"
    assert o["maxOffsetsPerTrigger"] == str(s.max_offsets_per_trigger) and o["failOnDataLoss"] == "true"
    assert o["startingOffsets"] == s.starting_offsets
    assert app_plan.source_options(s, '{"t":{"0":5}}')["startingOffsets"] == '{"t":{"0":5}}'


def test_a_lookup_sent_to_a_dead_leader_is_given_up_within_seconds_and_asked_again():
    """Kafka's default gives a lookup 60 s, and the admin client raises a shorter request timeout to that default:
    cluster chaos seed 4711 stalled a batch 60 s on a node the controller had fenced 54 s before."""
    o = app_plan.source_options(config.load(env={}))
    lookup_ms = int(o["kafka.default.api.timeout.ms"])
    assert lookup_ms <= 15_000 and int(o["kafka.request.timeout.ms"]) <= lookup_ms
    # together the attempts still outlast a broker's fencing and a leader election (so a short outage does not
    # fail the batch and restart the job), and stay within what Kafka's default would have waited (3 x 60 s)
    attempts, retry_ms = int(o["fetchOffset.numRetries"]), int(o["fetchOffset.retryIntervalMs"])
    assert 90_000 <= attempts * (lookup_ms + retry_ms) <= 180_000


def test_every_spark_reader_bounds_how_long_the_broker_holds_a_fetch_that_finds_nothing():
    """A read task's offset lookup after each poll queues behind the fetch a poll that drained the log sent ahead
    (one request at a time per connection): on a live feed, Kafka's default 500 ms made the stream's slowest batches.
    The stream's source and the batch reads (reconciliation, backfills) carry the same bound."""
    s = config.load(env={})
    for options in (app_plan.source_options(s), kafka_source.kafka_options(s)):
        assert int(options["kafka.fetch.max.wait.ms"]) <= 50
