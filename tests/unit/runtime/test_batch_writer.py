"""The driver's foreachBatch (onceflow.runtime.batch_writer.BatchWriter) on the protocol's fakes (onceflow.testing: an
in-memory transactional cluster) and a checkpoint of its own: a new batch computed then written in one transaction,
a committed batch only run for Spark's state, a stop before a batch, every failure recorded for the driver's exit
code, the status file after each batch, a stop that waits for Spark's commit of the last batch. No Spark: the
batch's output is a list of rows (the Spark path is `SparkOutput`, run by every integration test)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from confluent_kafka import KafkaError

from onceflow import config, wire
from onceflow.kafka import transactional as tw
from onceflow.protocol.batch_sink import OutRecord
from onceflow.protocol.exactly_once import ExactlyOnceSink
from onceflow.rules import checkpoint, clock
from onceflow.rules.ledger import Decision
from onceflow.rules.sources import SourcePartition
from onceflow.runtime import run_files
from onceflow.runtime.batch_writer import BatchWriter, Status
from onceflow.runtime.driver_state import StopRequested
from onceflow.testing.kafka import FakeCluster, FakeSinkReads, kafka_error

ROWS = [
    OutRecord(wire.KIND_RESULT, "2026-11-17T00:00:00.000Z|10.0.0.1", b"3"),
    OutRecord(wire.KIND_DLQ, "0:7", b"garbage", src_partition=0, src_offset=7, reason="unparseable"),
]


class Checkpoint(dict):
    """A checkpoint's files by path (onceflow.rules.checkpoint.CheckpointFS), as Spark writes them."""

    def read_text(self, rel: str) -> str | None:
        return self.get(rel)

    def planned(
        self, s: config.Settings, batch: int, end: int, watermark_ms: int = 0, ts_ms: int | None = None
    ) -> None:
        meta = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": clock.now_ms() if ts_ms is None else ts_ms}
        self[f"offsets/{batch}"] = f"v1\n{json.dumps(meta)}\n{json.dumps({s.source_topic: {'0': end}})}"


class Output:
    """The batch's output as the test gives it (the DataFrame Spark would hand in is the list of rows itself)."""

    def __init__(self):
        self.stored_batches, self.advanced = 0, 0
        self.collected: list[bool] = []  # per stored batch: held whole by the driver (a small output) or not

    @contextmanager
    def stored(self, df, collect=False):
        self.stored_batches += 1
        self.collected.append(collect)
        yield list(df)

    def advance(self, df) -> None:
        self.advanced += 1


@pytest.fixture
def s(tmp_path):
    return config.load(env={}, var_dir=tmp_path, close_out_batches=False)


@pytest.fixture
def fs(s):
    cp = Checkpoint({"sources/0/0": "\x00v1\n" + json.dumps({s.source_topic: {"0": 0}})})
    cp.planned(s, 0, 10)
    cp.planned(s, 1, 20)
    return cp


def writer(s, cluster, fs, scripts=(), output=None, heap=None):
    sink = ExactlyOnceSink(
        s,
        cluster.bus(s),
        producer_factory=cluster.producer_factory(s.transactional_id, scripts),
        reads=FakeSinkReads(cluster, s),
    )
    return BatchWriter(s, sink, fs, checkpoint.Epoch(), Status(s), output or Output(), heap)


def test_a_new_batch_is_computed_then_written_in_one_transaction_and_the_status_says_so(s, fs):
    c = FakeCluster()
    w = writer(s, c, fs)
    w(ROWS, 0)
    assert w.output.stored_batches == 1 and w.output.advanced == 0
    assert [r.value for r in c.topic(s.sink_topic)] == [b"3"] and len(c.topic(s.dlq_topic)) == 1
    p0 = SourcePartition(s.source_topic, 0)
    assert FakeSinkReads(c, s).committed([p0]).offsets == {p0: 10}
    assert w.batches[0] == {"ledger_batch": 0, "epoch": 0, "decision": Decision.WRITE.value}
    assert w.last_written == 0 and not w.failure
    st = run_files.JobStatus.read(s.status_file)
    assert (st.last_batch, st.committed_batches, st.last_outputs, st.last_dlq, st.running_batch) == (0, 1, 1, 1, None)
    assert st.end_offsets == {"0": 10} and set(st.last_timings) == {"decide_ms", "compute_ms", "txn_ms"}


def test_a_batch_committed_before_only_advances_sparks_state_and_writes_nothing(s, fs):
    c = FakeCluster()
    writer(s, c, fs)(ROWS, 0)
    again = writer(s, c, fs)  # a restart: Spark plans batch 0 again, its transaction committed before the crash
    again(ROWS, 0)
    assert again.output.advanced == 1 and again.output.stored_batches == 0  # its output never computed
    assert len(c.topic(s.sink_topic)) == 1 and len(c.topic(s.ledger_topic)) == 1
    assert again.batches[0]["decision"] == Decision.SKIP.value
    st = run_files.JobStatus.read(s.status_file)
    assert (st.replays_skipped, st.committed_batches, st.last_batch) == (1, 0, 0)
    again(ROWS, 1)  # and the next batch follows it
    p0 = SourcePartition(s.source_topic, 0)
    assert FakeSinkReads(c, s).committed([p0]).offsets == {p0: 20}


def test_a_stop_before_a_batch_starts_no_transaction_and_is_no_failure(s, fs):
    c = FakeCluster()
    w = writer(s, c, fs)
    w.stop.set()
    with pytest.raises(StopRequested):
        w(ROWS, 0)
    assert not [m for _, m in c.calls if m == "begin_transaction"] and w.output.stored_batches == 0
    assert not w.failure and w.last_written is None


@pytest.mark.parametrize(
    "script, error",
    [
        ({"commit_transaction": [kafka_error(KafkaError._FENCED, fatal=True)]}, tw.Fenced),
        ({"produce": [None, kafka_error(KafkaError.UNKNOWN)]}, tw.Aborted),
    ],
    ids=["fenced", "aborted"],
)
def test_a_transaction_that_fails_is_recorded_for_the_exit_code_and_raised_with_nothing_visible(s, fs, script, error):
    c = FakeCluster()
    w = writer(s, c, fs, [script])
    with pytest.raises(error):
        w(ROWS, 0)
    assert [type(e) for e in w.failure] == [error] and w.last_written is None
    p0 = SourcePartition(s.source_topic, 0)
    assert c.topic(s.sink_topic) == [] and FakeSinkReads(c, s).committed([p0]).offsets == {}
    st = run_files.JobStatus.read(s.status_file)
    assert st.running_batch == 0 and st.committed_batches == 0  # health sees the batch it died in


def test_a_batch_the_checkpoint_does_not_plan_is_a_failure_before_any_write(s, fs):
    c = FakeCluster()
    w = writer(s, c, fs)
    with pytest.raises(checkpoint.CheckpointError, match="offsets/5 is missing"):
        w(ROWS, 5)
    assert isinstance(w.failure[0], checkpoint.CheckpointError) and w.output.stored_batches == 0
    assert not [m for _, m in c.calls if m == "begin_transaction"]


def test_a_batch_that_closes_windows_is_followed_at_once_and_counted(s, fs, monkeypatch):
    """Close-out pacing: the batch that moves the watermark past a window end is followed by the next at once; one
    that does not waits for the trigger's next multiple."""
    paced = s.replace(close_out_batches=True, trigger_interval_s=5.0, window_s=5, watermark_s=5)
    wm = 1_794_873_600_000  # a window boundary
    fs.planned(paced, 0, 10, watermark_ms=wm)
    fs.planned(paced, 1, 20, watermark_ms=wm)
    c = FakeCluster()
    w = writer(paced, c, fs)
    w.query = object()  # the running query, whose statistics batch_stats reads
    newest = iter([wm + 11_000, wm + 2_000])  # the newest event time each batch read
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: next(newest))
    assert w._one(ROWS, 0) == 0.0  # watermark to wm + 6 s: the window ending at wm + 5 s closes
    assert run_files.JobStatus.read(paced.status_file).close_out_batches == 1
    assert w._one(ROWS, 1) > 0.0  # the watermark does not pass another window end: the trigger's cadence
    assert run_files.JobStatus.read(paced.status_file).close_out_batches == 1


def test_a_window_whose_closing_event_is_late_is_chased_once_then_the_cadence_resumes(s, fs, monkeypatch):
    """The batch planned 300 ms after a window's closing moment read the stream 200 ms short of the closing event:
    the next batch is planned once that lag has passed again (plus the margin), not a whole interval later; when
    that batch still finds the event short, the trigger's cadence takes over again."""
    paced = s.replace(close_out_batches=True, trigger_interval_s=5.0, window_s=5, watermark_s=5, trigger_margin_ms=300)
    closing = 1_794_873_610_000  # the event time that closes the window ending 10 s before it
    now = [closing + 400]
    monkeypatch.setattr("onceflow.rules.clock.now_ms", lambda: now[0])
    fs.planned(paced, 0, 10, watermark_ms=closing - 10_000, ts_ms=closing + 300)
    fs.planned(paced, 1, 20, watermark_ms=closing - 10_000, ts_ms=closing + 800)
    w = writer(paced, FakeCluster(), fs)
    w.query = object()
    newest = iter([closing - 200, closing - 100])
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: next(newest))
    assert w._one(ROWS, 0) == 0.4  # at closing + 500 ms of lag + 300 ms of margin; it is closing + 400 ms
    now[0] = closing + 900
    assert w._one(ROWS, 1) == 4.4  # chased once: the cadence's next batch, at closing + 5.3 s
    assert run_files.JobStatus.read(paced.status_file).close_out_batches == 0


@pytest.mark.parametrize("end, delay_s", [(20_010, 3.45), (1_010, 4.15)])
def test_the_input_rate_between_two_batches_plannings_decides_a_lead_batch(s, fs, monkeypatch, end, delay_s):
    """A batch planned 600 ms after a window's moment, 4 s after the batch before it: 20,000 records read (5,000 a
    second) and the boundary batch due at the next closing moment plus the margin would hold another 3.9 s of them,
    so a lead batch is planned the settings' 700 ms before it; 1,000 records (250 a second): the cadence alone."""
    paced = s.replace(close_out_batches=True, trigger_interval_s=5.0, window_s=5, watermark_s=5)
    closing = 1_794_873_610_000  # the event time that closes the window ending 5 s before it
    monkeypatch.setattr("onceflow.rules.clock.now_ms", lambda: closing - 4_000)
    fs.planned(paced, 0, 10, watermark_ms=closing - 15_000, ts_ms=closing - 8_400)
    fs.planned(paced, 1, end, watermark_ms=closing - 9_850, ts_ms=closing - 4_400)
    w = writer(paced, FakeCluster(), fs)
    w.query = object()
    newest = iter([closing - 8_420, closing - 4_420])
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: next(newest))
    w._one(ROWS, 0)
    # the boundary batch at closing + 150 ms; the lead batch at closing - 550 ms; it is closing - 4 s
    assert w._one(ROWS, 1) == delay_s


def test_a_small_output_is_collected_whole_once_sparks_progress_bounds_it(s, fs):
    """Before Spark's first progress report nothing bounds a batch's output: it is stored and streamed. Once a report
    says how many rows the state holds, a batch whose bound (those rows, the records read since, one result per
    output and one DLQ record per record read) is within collect_max_rows comes in one Spark job; a larger one, or
    any with collect_max_rows 0, is stored again."""
    fs.planned(s, 2, 30)
    fs.planned(s, 3, 40)
    w = writer(s.replace(collect_max_rows=45), FakeCluster(), fs)
    w(ROWS, 0)  # no report yet
    w.status.update(progress={"batch": 0, "state_rows": 5})
    w(ROWS, 1)  # 5 state rows + 10 records read + 2 x 10 = 35
    w.status.update(progress={"batch": 0, "state_rows": 6})  # batch 1's report is still on its way
    w(ROWS, 2)  # 6 + 10 + 10 + 2 x 10 = 46: over
    w.status.update(progress={"batch": 2, "state_rows": 5})
    w(ROWS, 3)  # 5 + 10 + 2 x 10 = 35
    assert w.output.collected == [False, True, False, True]
    assert set(w.spans) == {3}, "the spans counted in a report's state rows are dropped"
    never = writer(s.replace(collect_max_rows=0), FakeCluster(), fs)
    never.status.update(progress={"batch": 0, "state_rows": 0})
    never(ROWS, 0)
    assert never.output.collected == [False]


class Heap:
    """The driver JVM's old generation: its used and committed bytes, and the collections asked for."""

    def __init__(self, used: int, committed: int = 1000, fails: bool = False):
        self.used, self.committed, self.fails, self.collections = used, committed, fails, 0

    def old_used(self) -> tuple[int, int]:
        if self.fails:
            raise RuntimeError("py4j: the JVM is gone")
        return self.used, self.committed

    def collect(self) -> None:
        self.collections += 1
        self.used = 100


def test_the_drivers_heap_is_collected_in_the_wait_before_the_next_batch_when_due(s, fs, monkeypatch):
    """A written batch that waits for the trigger's next multiple collects the driver's heap first when its old
    generation is near full (Settings.gc_while_idle_at of its committed size), and waits only what is left; below
    the threshold, in a wait too short, or with a heap that cannot be read, the JVM is left to collect alone."""
    paced = s.replace(close_out_batches=True, trigger_interval_s=5.0, window_s=5, watermark_s=5)
    wm = 1_794_873_600_000
    # each batch planned 300 ms after a multiple of the trigger and done 200 ms later: the cadence's wait is 4.65 s,
    # whatever the test's own clock reads
    monkeypatch.setattr("onceflow.rules.clock.now_ms", lambda: wm + 500)
    for b in range(4):
        fs.planned(paced, b, 10 * (b + 1), watermark_ms=wm, ts_ms=wm + 300)
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: wm + 2_000)
    waits: list[float] = []
    heap = Heap(used=800)
    w = writer(paced, FakeCluster(), fs, heap=heap)
    w.query = object()
    monkeypatch.setattr(w.stop, "wait", lambda t: waits.append(t))
    w(ROWS, 0)  # 800 of 1000 committed: collected, then the rest of the wait
    assert heap.collections == 1 and 0 < waits[-1] <= 4.65
    assert run_files.JobStatus.read(paced.status_file).idle_collections == 1
    w(ROWS, 1)  # 100 after the collection: nothing to do
    assert heap.collections == 1
    heap.used = 900
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: wm + 11_000)
    w(ROWS, 2)  # closes a window: the close-out batch runs at once, no collection in between
    assert heap.collections == 1 and waits[-1] == 0.0
    heap.fails = True
    monkeypatch.setattr("onceflow.runtime.batch_writer.batch_stats.max_event_ms", lambda q: wm + 2_000)
    w(ROWS, 3)  # unreadable: left to the JVM for good, the batch and its wait as before
    assert w.heap is None and waits[-1] > 0 and not w.failure


def test_a_stop_waits_for_sparks_commit_of_the_last_written_batch_then_stops_the_query(s, fs, monkeypatch):
    c = FakeCluster()
    w = writer(s, c, fs)
    w(ROWS, 0)
    stopped = []

    class Query:
        def stop(self):
            stopped.append(fs.read_text("commits/0"))

    seen = []
    monkeypatch.setattr(
        "onceflow.runtime.batch_writer.time.sleep", lambda _: seen.append(fs.setdefault("commits/0", "v1"))
    )
    w.stop_at_boundary(Query())
    assert seen and stopped == ["v1"]  # the query stopped only once Spark had written commits/0


def test_a_batch_arriving_while_a_stop_holds_the_writer_neither_waits_for_it_nor_starts(s, fs):
    """A stop holds the writer's lock while it waits for Spark's commit of the last batch; a batch Spark hands in
    meanwhile must not block on it (Spark's stop cannot interrupt a Python callback) nor begin a transaction."""
    c = FakeCluster()
    w = writer(s, c, fs)
    w.lock.acquire()  # the stop's hold
    w.stop.set()
    try:
        with pytest.raises(StopRequested, match="before batch 0"):
            w(ROWS, 0)
    finally:
        w.lock.release()
    assert w.output.stored_batches == 0 and not [m for _, m in c.calls if m == "begin_transaction"]
