"""Reconciliation of source offsets against committed sink results (what `<app_id>_reconciliation` and
`onceflow reconcile` run), for any declared app, with Spark: over a range of committed batches in a consistent cut,
I1 coverage, the replay of the app's own plan (onceflow.operations.replay), I4 (nothing aborted visible), and the
app's own reference check where it declares one (ip_count's recount: onceflow_apps.ip_count_reference). The scheduled
chain proves each batch once (onceflow.operations.recon_chain). Each run's result goes to the `onceflow_reconciliation`
topic and a JSON file; a failed check fails the run and alerts with the precise difference.
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from onceflow.app import registry
from onceflow.config import Settings
from onceflow.operations import audit, committed_reads, recon_chain, replay
from onceflow.rules import clock, progress, sources
from onceflow.rules import reconciliation as rr
from onceflow.rules.checkpoint import parse_initial_offsets
from onceflow.rules.ledger import check_coverage
from onceflow.rules.sources import SourcePartition
from onceflow.storage.store import Store

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the run
def run_chain(spark: SparkSession, settings: Settings, with_gx: bool = True) -> rr.Result:
    """The scheduled chain's next slice (onceflow.operations.recon_chain): the batches committed after the last one the chain
    proved, up to the newest in a consistent cut taken now, at most ONCEFLOW_RECONCILE_MAX_BATCHES."""
    t0 = clock.now_ms()
    pos = recon_chain.position(settings)
    snap = audit.snapshot(settings)
    rng = rr.chain_range(pos.batch, snap.entries, settings.reconcile_max_batches)
    if rng is None:
        res = rr.Result(
            app=settings.app_id,
            run_id=uuid.uuid4().hex[:12],
            first_batch=None,
            last_batch=None,
            ranges={},
            started_ms=t0,
            mode=rr.Mode.CHAIN,
            coverage=rr.coverage([]),
            snapshot_batch=snap.batch,
            proven_before=pos.batch,
        )
        res.checks.append(
            rr.Check(
                "range",
                rr.Status.SKIP,
                f"nothing new: the chain has proven every committed batch (through {pos.batch})",
            )
        )
        res.finished_ms = clock.now_ms()
        return res
    res = run(spark, settings, first=rng[0], last=rng[1], with_gx=with_gx, snap=snap, chain=True)
    res.mode, res.proven_before = rr.Mode.CHAIN, pos.batch
    return res


def run(
    spark: SparkSession,
    settings: Settings,
    first: int | None = None,
    last: int | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    with_gx: bool = True,
    snap: audit.Snapshot | None = None,
    chain: bool = False,
) -> rr.Result:
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    t0 = clock.now_ms()
    snap = snap or audit.snapshot(settings)  # a consistent cut: a running job's later batches are left out
    entries, quarantine = snap.entries, audit.quarantined(snap.records)
    selected = rr.select_batches(entries, first, last, since_ms, until_ms)
    res = rr.Result(
        app=settings.app_id,
        run_id=uuid.uuid4().hex[:12],
        first_batch=selected[0].batch if selected else None,
        last_batch=selected[-1].batch if selected else None,
        ranges=rr.source_ranges(selected),
        started_ms=t0,
        snapshot_batch=snap.batch,
        coverage=rr.coverage(selected),
    )
    if selected:  # where the job's group stood after the last batch: the chain's position once it is proven
        ends: dict[SourcePartition, int] = {}
        for e in entries:
            if e.batch <= selected[-1].batch:
                ends.update(e.end)
        res.coverage["end_offsets"] = sources.keyed_to_json(ends, int)
        res.coverage["end_topic"] = sources.topic_field(ends)  # what the keys are on (onceflow.rules.sources)
    res.checks.append(
        rr.coverage_check(check_coverage(entries, snap.committed.offsets or None, starting_offsets(settings)))
    )
    if not selected:
        res.checks.append(rr.Check("range", rr.Status.SKIP, "no committed batch in the requested range"))
        res.finished_ms = clock.now_ms()
        return res
    app = settings.declared_app()
    table_sink = settings.sink_kind == "postgres"
    if app.reference is not None and table_sink:
        res.checks.append(
            rr.Check(
                "reference",
                rr.Status.SKIP,
                "the app's reference check reads its sink topic; this app writes a PostgreSQL table, proven by the "
                "replay of its plan against the table (and `onceflow audit`)",
            )
        )
    elif app.reference is not None:  # the app's own independent check (ip_count's recount), beside the replay
        reference = registry.load(app.reference)
        reference(spark, settings, res, selected, entries, quarantine, with_gx, chain)
    # the proof for any app: its own plan replayed over the committed ranges, against the sink and the DLQ (across
    # a savepoint restore too: the ledger's stream batches are one history, onceflow.rules.replay.plan)
    # The replay's state is kept between runs, the chain's apart from manual runs': each run replays only the
    # batches no run before it replayed (onceflow.operations.replay, `keep`).
    keep = recon_chain.home(settings) / ("replay-chain" if chain else "replay-manual")
    res.checks.append(replay.check(spark, settings, app, entries, selected, quarantine, keep=keep))
    progress.report(f"reconciliation of batches {selected[0].batch}..{selected[-1].batch}: the replay done")
    if table_sink:  # I4 on a table is the database's: no session sees another's uncommitted rows
        res.checks.append(
            rr.Check("visibility", rr.Status.SKIP, "a PostgreSQL sink: uncommitted rows are never visible (MVCC)")
        )
    else:
        res.checks.append(_visibility(spark, settings, selected, entries))
    res.finished_ms = clock.now_ms()
    log.info(
        "reconciled batches %d..%d in %.1f s: %s",
        selected[0].batch,
        selected[-1].batch,
        (res.finished_ms - t0) / 1000,
        {c.name: c.status for c in res.checks},
    )
    return res


def starting_offsets(settings: Settings) -> dict[SourcePartition, int] | None:
    """Where the job began reading (Spark's initial offsets in the checkpoint), when it is at hand."""
    try:
        text = Store(settings.checkpoint).read_text("sources/0/0")
    except Exception:
        return None
    return parse_initial_offsets(text, settings.source_topic_list) if text else None


def _visibility(spark, settings, selected, entries) -> rr.Check:
    """I4 over every topic the app writes results to (its outputs'): nothing visible that was not committed."""
    seen = [0, 0, 0, 0]  # committed, uncommitted, gone, foreign
    for topic in settings.sink_topics:
        committed_view = committed_reads.bounded(spark, settings, topic, selected, entries)
        uncommitted = committed_reads.bounded(spark, settings, topic, selected, entries, isolation="read_uncommitted")
        # one join of the two views, one Spark job (each view is a read of the topic: four counts read it eight times)
        c = committed_view.select("partition", "offset", F.lit(True).alias("in_c"))
        u = uncommitted.select("partition", "offset", "app", F.lit(True).alias("in_u"))
        j = c.join(u, ["partition", "offset"], "full_outer")
        only_u = F.col("in_c").isNull() & F.col("in_u").isNotNull()
        row = j.agg(
            F.count("in_c"),
            F.count("in_u"),
            F.count(F.when(F.col("in_c").isNotNull() & F.col("in_u").isNull(), True)),  # committed, not in the log
            F.count(F.when(only_u & (F.col("app").isNull() | (F.col("app") != settings.app_id)), True)),  # foreign
        ).first()
        assert row is not None  # a global aggregation has one row
        for i in range(4):
            seen[i] += int(row[i])
    return rr.visibility_check(*seen)
