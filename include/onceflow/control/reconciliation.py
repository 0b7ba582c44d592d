"""What the reconciliation DAG and `onceflow reconcile` call around the Spark recount (onceflow.operations.reconcile): which
run it is (a manual range, or the scheduled chain's next slice), submitting it, recording its result, alerting.
Light: no Spark here, so the DAG file that imports it parses fast."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from onceflow import wire
from onceflow.config import Settings
from onceflow.control import alerts
from onceflow.kafka import clients as kafka_clients
from onceflow.operations import recon_chain
from onceflow.rules import reconciliation as rr
from onceflow.runtime import launcher

SCRIPT = launcher.RECONCILE_SCRIPT


def range_from(first=None, last=None, since=None, until=None) -> dict | None:
    """A manual run's range from its params (batches or commit times), checked before anything runs; None when
    none is given: then the run is the chain's next slice (onceflow.operations.recon_chain). The timetable's data interval is
    never used: Airflow 3's scheduled runs have zero-length intervals, and the chain covers every batch anyway."""
    if first is None and last is None and since in (None, "") and until in (None, ""):
        return None
    if (first is None) != (last is None):
        raise rr.ReconcileError("give both first_batch and last_batch, or neither")
    if first is not None:
        if since or until:
            raise rr.ReconcileError("give a range of batches or a range of times, not both")
        if last < first:
            raise rr.ReconcileError(f"last_batch {last} is before first_batch {first}")
        return {"first": first, "last": last}
    since_ms, until_ms = rr.to_ms(since), rr.to_ms(until)
    if since_ms is not None and until_ms is not None and until_ms <= since_ms:
        raise rr.ReconcileError("the end of the time range is not after its start")
    return {"since_ms": since_ms, "until_ms": until_ms}


def args_for(rng: dict | None, with_gx: bool = True) -> list[str]:
    """onceflow/entrypoints/reconcile.py's arguments: a manual range, or (None) the chain's next slice."""
    out = [] if rng is not None else ["--chain"]
    for flag, key in (("--first", "first"), ("--last", "last"), ("--since-ms", "since_ms"), ("--until-ms", "until_ms")):
        if rng and rng.get(key) is not None:
            out += [flag, str(rng[key])]
    return out + ([] if with_gx else ["--no-gx"])


def log_file(settings: Settings) -> Path:
    return recon_chain.home(settings) / "reconcile.log"


def submitted(settings: Settings, argv: list[str], out: Path, timeout_s: float = 3600.0) -> rr.Result:
    """Run onceflow/entrypoints/reconcile.py through `argv` (spark-submit, e.g. built by the Spark provider's hook) here, relaying
    its progress, and read its result back."""
    from onceflow.runtime import batch_jobs

    return rr.Result.from_dict(batch_jobs.run(settings, "reconciliation", argv, out, log_file(settings), timeout_s))


def record(settings: Settings, res: rr.Result, sink: alerts.AlertSink | None = None) -> dict:
    """Store the result (file, and the reconciliation topic: a chain run's in one transaction with the chain's
    move) and raise or resolve one alert per failed check."""
    d = res.as_dict()
    path = recon_chain.home(settings) / "runs" / f"{res.started_ms}-{res.run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d, indent=1))
    chain: dict = {}
    if res.mode == rr.Mode.CHAIN:
        chain = recon_chain.commit(settings, res)
    else:
        p = kafka_clients.idempotent_producer(settings)
        p.produce(
            settings.reconciliation_topic,
            key=settings.app_id.encode(),
            value=json.dumps(d).encode(),
            headers=[(wire.H_APP, settings.app_id.encode()), (wire.H_KIND, b"reconciliation")],
        )
        if p.flush(30):
            raise RuntimeError("the reconciliation result could not be recorded")
    if sink is not None:
        prefix = f"reconcile:{settings.app_id}:"
        conds = [
            alerts.Condition(
                prefix + c.name,
                alerts.Severity.CRITICAL,
                f"reconciliation of batches {res.first_batch}..{res.last_batch}: {c.name} failed: {c.summary}",
                "read the run's differences (onceflow reconcile status, the "
                "reconciliation topic or the run's JSON); the job is not stopped",
                {"differences": c.differences[:10], "run": res.run_id},
            )
            for c in res.failures()
        ]
        sink.raise_and_resolve(conds, source="reconciliation", scope_prefix=prefix)
    return {"file": str(path), "ok": res.ok, "verdict": res.verdict} | chain


def summary(res: rr.Result, info: dict) -> dict:
    """What a run says in a log line, the DAG's XCom and the CLI: the verdict, the coverage, each check."""
    return {
        "run_id": res.run_id,
        "mode": res.mode,
        "verdict": res.verdict,
        "batches": [res.first_batch, res.last_batch],
        "coverage": res.coverage,
        "snapshot_batch": res.snapshot_batch,
        "checks": {c.name: {"status": c.status, "summary": c.summary} for c in res.checks},
        "data_docs": res.data_docs,
        **{k: v for k, v in info.items() if k != "ok"},
    }


def submit_for_dag(
    settings: Settings, params: dict, run_id: str, submit_argv: Callable[[list[str]], list[str]], timeout_s: float
) -> dict:
    """The reconciliation DAG's first step: a range given in the params is a manual run; none (every scheduled run,
    and a manual trigger without a range) is the chain's next slice. Starts the recount detached and returns its
    handle (onceflow.runtime.batch_jobs), which the DAG waits on in the triggerer."""
    from onceflow.runtime import batch_jobs

    rng = range_from(params.get("first_batch"), params.get("last_batch"), params.get("since"), params.get("until"))
    out = recon_chain.home(settings) / "runs" / f"pending-{run_id.replace(':', '_').replace('+', '_')}.json"
    argv = submit_argv(args_for(rng, params.get("great_expectations", True)) + ["--out", str(out)])
    return batch_jobs.start(settings, "reconciliation", argv, out, log_file(settings), timeout_s).as_dict()


def finish_for_dag(settings: Settings, result: dict, handle: dict, sink: alerts.AlertSink | None) -> dict:
    """The DAG's last step, on the recount's result: record, alert; raise when a check failed, after the result
    is recorded."""
    res = rr.Result.from_dict(result)
    info = record(settings, res, sink)
    Path(handle["out"]).unlink(missing_ok=True)
    brief = summary(res, info)
    print(
        f"reconciliation {res.mode} run {res.run_id}: {res.verdict}, batches {res.first_batch}..{res.last_batch}"
        + (f" (the chain had proven through {res.proven_before})" if res.mode == rr.Mode.CHAIN else "")
    )
    if not res.ok:
        raise RuntimeError(
            "reconciliation failed: " + "; ".join(f"{c.name}: {c.summary} {c.differences[:5]}" for c in res.failures())
        )
    return brief
