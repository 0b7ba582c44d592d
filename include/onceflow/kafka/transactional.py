"""The one transactional writer: the only code that touches a Kafka producer's transaction internals.

The streaming job (a batch), backfills (a chunk) and operator records (a restore, a quarantine) all write through
`TransactionalWriter`: begin, produce, send offsets, commit; every Kafka error is classified once, here, into what
the caller must do:

| error             | what happened                                            | the writer           | the caller          |
|-------------------|----------------------------------------------------------|----------------------|---------------------|
| `Fenced`          | a newer producer with this transactional.id took over    | marks itself dead    | stops for good      |
| `CoordinatorTimedOut` | the coordinator aborted the transaction at its timeout | aborts             | replays the work    |
| `OutcomeUnknown`  | commit or abort timed out: it may still land; or a call hung | replaces its producer| reads back, decides |
| `Aborted`         | an abortable error (a record refused, a broker moved)    | aborts               | retries or fails    |
| `FatalProducerError` | fatal, not fencing (the producer is unusable)         | marks itself dead    | restarts            |
| `TxnConfigError`  | the broker refuses our settings or permissions           | aborts if it can     | fixes configuration |

Why a timed-out commit replaces the producer: librdkafka does not implement KIP-890's server-side defence, so a
commit or abort that timed out on the client may still be applied later, to the next transaction of the same
producer. The writer therefore never reuses it: it initialises a new producer with the same transactional.id first
(InitProducerId waits until the pending commit or abort has settled, and bumps the epoch, fencing the old one),
then closes the old. Never after `Fenced`: re-initialising would steal the id back from the newer instance.
Modelled on flink-connector-kafka's sink/internal (one class owns the producer's transaction internals) and
quix-streams' internal producer (typed exceptions, named retry bounds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Any, ClassVar

from confluent_kafka import KafkaError, KafkaException

from onceflow import wire
from onceflow.kafka.surfaces import Producer
from onceflow.wire import OnceflowError

log = logging.getLogger(__name__)


class Outcome(StrEnum):
    """What a Kafka error means for the transaction (`classify`); every TxnError carries one."""

    FENCED = "fenced"
    COORDINATOR_TIMEOUT = "coordinator_timeout"
    OUTCOME_UNKNOWN = "outcome_unknown"
    ABORTABLE = "abortable"
    FATAL = "fatal"
    RETRIABLE = "retriable"
    CONFIG = "config"


# Not INVALID_TXN_STATE: a call that does not fit the transaction's state says nothing of another instance (as
# fencing it would stop the job for good); librdkafka's fatal/abortable flags decide it.
FENCING_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
CONFIG_CODES = {
    KafkaError.INVALID_TRANSACTION_TIMEOUT,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}
TIMEOUT_SHARE = 0.95  # a transaction this close to transaction.timeout.ms was aborted by the coordinator
RETRY_PAUSE_S = 0.2  # between tries of a retriable init or commit


class TxnError(OnceflowError):
    """A transaction call failed; `outcome` says what that means (one subclass per outcome)."""

    outcome: ClassVar[Outcome]

    def __init__(
        self, message: str, error: KafkaError | None = None, phase: str | None = None, elapsed_ms: float | None = None
    ):
        super().__init__(message)
        self.error, self.phase, self.elapsed_ms = error, phase, elapsed_ms


class Fenced(TxnError, wire.Fenced):
    """Another producer with this transactional.id took over: stop for good, never re-initialise."""

    outcome = Outcome.FENCED


class CoordinatorTimedOut(TxnError):
    """The coordinator aborted the transaction after transaction.timeout.ms: the work can be replayed."""

    outcome = Outcome.COORDINATOR_TIMEOUT


class OutcomeUnknown(TxnError):
    """The commit (or abort) timed out, or a call hung past its timeout. The writer has replaced its producer,
    which settled the outcome: read back what is committed and decide."""

    outcome = Outcome.OUTCOME_UNKNOWN


class Aborted(TxnError):
    """An abortable error; the writer aborted the transaction. The work may be retried."""

    outcome = Outcome.ABORTABLE


class FatalProducerError(TxnError):
    """A fatal error that is not fencing: the producer is unusable; restart."""

    outcome = Outcome.FATAL


class BufferStuck(OnceflowError):
    """The producer's local queue stayed full for a transaction's timeout: the transaction cannot commit in time.
    Not a TxnError: nothing has settled the transaction, so `transaction()` aborts it."""


class TxnConfigError(TxnError):
    """The broker refuses our configuration or permissions: fix them."""

    outcome = Outcome.CONFIG


_CLASSES = {
    Outcome.FENCED: Fenced,
    Outcome.COORDINATOR_TIMEOUT: CoordinatorTimedOut,
    Outcome.OUTCOME_UNKNOWN: OutcomeUnknown,
    Outcome.ABORTABLE: Aborted,
    Outcome.FATAL: FatalProducerError,
    Outcome.CONFIG: TxnConfigError,
    Outcome.RETRIABLE: Aborted,
}


def classify(err: KafkaError, *, phase: str, elapsed_ms: float | None, timeout_ms: int) -> Outcome:
    """What a Kafka error in `phase` (init, begin, produce, send_offsets, commit, abort) means, in this order:
    configuration and permission codes are CONFIG; `_TIMED_OUT` of a commit or abort is OUTCOME_UNKNOWN; a fencing
    code or an abortable error after TIMEOUT_SHARE of the timeout is COORDINATOR_TIMEOUT (the coordinator's abort
    bumps the epoch, which looks like fencing); other fencing codes are FENCED; then fatal, abortable, retriable
    as librdkafka flags them; anything else is ABORTABLE inside a transaction and FATAL at init."""
    code = err.code()
    if code in CONFIG_CODES:
        return Outcome.CONFIG
    if code == KafkaError._TIMED_OUT and phase in ("commit", "abort"):
        return Outcome.OUTCOME_UNKNOWN
    late = elapsed_ms is not None and elapsed_ms >= TIMEOUT_SHARE * timeout_ms
    if late and phase not in ("init", "abort") and (code in FENCING_CODES or err.txn_requires_abort()):
        return Outcome.COORDINATOR_TIMEOUT
    if code in FENCING_CODES:
        return Outcome.FENCED
    if err.fatal() or code == KafkaError._FATAL:
        return Outcome.FATAL
    if err.txn_requires_abort():
        return Outcome.ABORTABLE
    if err.retriable():
        return Outcome.RETRIABLE
    return Outcome.FATAL if phase == "init" else Outcome.ABORTABLE


def _meaning(kind: Outcome, err: KafkaError, elapsed_ms: float | None, timeout_ms: int) -> str:
    """What an error's message adds to the client's text, by outcome: what to change, or what happened."""
    if kind == Outcome.CONFIG:
        return f" ({_advice(err, timeout_ms)})"
    if kind == Outcome.COORDINATOR_TIMEOUT and elapsed_ms is not None:
        return f" (aborted by the coordinator after {elapsed_ms:.0f} ms, timeout {timeout_ms} ms)"
    if kind == Outcome.FENCED:
        return " (fenced by a newer instance of the app)"
    return ""


def _advice(err: KafkaError, timeout_ms: int) -> str:
    code = err.code()
    if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        return (
            f"the broker refused transaction.timeout.ms={timeout_ms}: it is above the broker's "
            "transaction.max.timeout.ms; lower ONCEFLOW_TRANSACTION_TIMEOUT_MS"
        )
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return "the principal may not use this transactional.id: grant it WRITE and DESCRIBE on it"
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return "the principal may not write a topic of the transaction: grant it WRITE on the topic"
    if code == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return "the principal may not commit the group's offsets: grant it READ on the consumer group"
    return "check the broker's configuration and the client's permissions"


class TransactionalWriter:
    def __init__(
        self,
        make_producer: Callable[[], Producer],
        transactional_id: str,
        timeout_ms: int,
        *,
        init_timeout_s: float = 60.0,
        commit_timeout_s: float = 120.0,
        hang_grace_s: float = 15.0,
        abort_timeout_s: float = 30.0,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        on_call: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self._make, self.transactional_id, self.timeout_ms = make_producer, transactional_id, timeout_ms
        self.init_timeout_s, self.commit_timeout_s, self.abort_timeout_s = (
            init_timeout_s,
            commit_timeout_s,
            abort_timeout_s,
        )
        self._on_event, self._clock, self._sleep = on_event, clock, sleep
        # called with the phase on a bounded call's own thread, before the producer call: fault injection holds it
        # there past its timeout, as librdkafka #5456 does (onceflow.faults, hang_send_offsets)
        self._on_call = on_call
        self.hang_grace_s = hang_grace_s
        self._wedged: list[Producer] = []  # producers stuck in a call: kept referenced, never closed (see send_offsets)
        self._dead: TxnError | None = None
        self._started: float | None = None  # when the open transaction began (clock)
        self._failed_delivery: str | None = None
        self._delivery_error: KafkaError | None = None  # the first failed delivery's error, for the classification
        self._producer: Producer | None = self._initialised(self._make())

    # ------------------------------------------------------------------ state
    @property
    def producer(self) -> Producer | None:
        """The live producer (None once the writer is closed)."""
        return self._producer

    @property
    def elapsed_ms(self) -> float | None:
        return None if self._started is None else (self._clock() - self._started) * 1000

    def _check(self) -> Producer:
        """The producer to call, unless a fenced or fatal error or a close left none."""
        if self._dead is not None:
            d = self._dead
            raise type(d)(f"the producer of {self.transactional_id} is unusable: {d}", d.error, d.phase)
        if self._producer is None:
            raise FatalProducerError(f"the writer of {self.transactional_id} is closed", None, "closed")
        return self._producer

    # ------------------------------------------------------------------ the transaction
    @contextlib.contextmanager
    def transaction(self) -> Iterator[TransactionalWriter]:
        """One transaction around the body: begin, and commit when the body returns. A TxnError has settled the
        transaction already (the writer aborted it, replaced its producer after an unknown outcome, or gave a
        fenced or fatal producer up) and passes as it is; anything else the body raises (a crash point, a record
        the broker refuses, a signal) aborts the transaction first."""
        self.begin()
        try:
            yield self
            self.commit()
        except TxnError:
            raise
        except BaseException:
            self.abort()
            raise

    def begin(self) -> None:
        producer = self._check()
        self._failed_delivery, self._delivery_error = None, None
        try:
            producer.begin_transaction()
        except KafkaException as e:
            raise self._failure(e, "begin") from e
        self._started = self._clock()

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[Any] | None = None,
        partition: int | None = None,
    ) -> None:
        producer = self._check()
        kw: dict[str, Any] = {"key": key, "value": value, "headers": headers, "on_delivery": self._on_delivery}
        if partition is not None:
            kw["partition"] = partition
        deadline: float | None = None
        while True:
            try:
                producer.produce(topic, **kw)
                return
            except BufferError as e:  # the local queue is full: let deliveries drain it, within a bound
                now = self._clock()
                deadline = deadline if deadline is not None else now + self.timeout_ms / 1000
                if now >= deadline:
                    raise BufferStuck(
                        f"the producer of {self.transactional_id} could not queue a record to {topic} for "
                        f"{self.timeout_ms / 1000:.0f} s (its queue stays full: the brokers do not take its records); "
                        f"the transaction is aborted and the batch replayed"
                    ) from e
                producer.poll(0.05)
            except KafkaException as e:
                raise self._failure(e, "produce") from e

    def flush(self, timeout_s: float) -> None:
        """Deliver what is queued to the brokers, inside the open transaction (a crash after it leaves the records
        in the transaction, which the coordinator then aborts: the fault tests use it)."""
        self._check().flush(timeout_s)

    def send_offsets(self, offsets: list[Any], group_metadata: Any, timeout_s: float = 30.0) -> None:
        """send_offsets_to_transaction, bounded. librdkafka can block in it past its timeout, for good, when the
        group coordinator's broker died (librdkafka #5456, #5511: found by killing that broker mid-transaction).
        The call runs on its own thread; if it has not returned a grace after its timeout (`hang_grace_s`, at most the
        timeout itself: a short timeout is a short bound), the producer is
        wedged: it is left alone (a call into it is still running, so it is never closed), a new producer with the
        same transactional.id fences it and aborts the open transaction, and OutcomeUnknown sends the caller to
        what is committed (nothing of this transaction is)."""
        producer = self._check()
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def call() -> None:
            try:
                if self._on_call is not None:
                    self._on_call("send_offsets")
                producer.send_offsets_to_transaction(offsets, group_metadata, timeout_s)
                outcome.append(None)
            except BaseException as e:  # handed to the caller's thread
                outcome.append(e)
            finally:
                done.set()

        threading.Thread(target=call, name=f"send-offsets {self.transactional_id}", daemon=True).start()
        bound_s = timeout_s + min(self.hang_grace_s, timeout_s)
        if not done.wait(bound_s):
            why = (
                f"send_offsets_to_transaction of {self.transactional_id} has not returned {bound_s:.0f}"
                f" s after it began (its timeout: {timeout_s:.0f} s): the producer waits on a group coordinator that "
                f"died (librdkafka #5456)"
            )
            self._started, self._producer = None, None  # the wedged producer is dropped, not closed
            self._wedged.append(producer)
            self._replace(why)
            raise OutcomeUnknown(f"{why}; replaced, its transaction aborted", None, "send_offsets")
        error = outcome[0]
        if isinstance(error, KafkaException):
            raise self._failure(error, "send_offsets") from error
        if error is not None:
            raise error

    def commit(self) -> None:
        producer = self._check()
        deadline = self._clock() + self.commit_timeout_s
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - self._clock()))
                self._started = None
                return
            except KafkaException as e:
                kind = classify(e.args[0], phase="commit", elapsed_ms=self.elapsed_ms, timeout_ms=self.timeout_ms)
                if kind == Outcome.RETRIABLE:
                    if self._clock() < deadline:  # librdkafka: call commit again
                        self._sleep(RETRY_PAUSE_S)
                        continue
                    # Retried until the deadline: the commit may still land, as after a timeout. Aborting and
                    # reusing this producer is the KIP-890 hazard; the producer is replaced instead.
                    kind = Outcome.OUTCOME_UNKNOWN
                raise self._failure(e, "commit", kind) from e

    def abort(self) -> None:
        """Abort the open transaction, if any; quiet about errors that leave nothing to abort."""
        if self._dead is not None or self._producer is None:
            self._started = None
            return
        try:
            self._producer.abort_transaction(self.abort_timeout_s)
        except KafkaException as e:
            err = e.args[0]
            kind = classify(err, phase="abort", elapsed_ms=None, timeout_ms=self.timeout_ms)
            if kind == Outcome.OUTCOME_UNKNOWN:
                self._replace(f"abort timed out: {err}")
            elif kind in (Outcome.FENCED, Outcome.FATAL):
                self._dead = _CLASSES[kind](f"abort of {self.transactional_id} failed: {err}", err, "abort")
            else:
                log.info("abort_transaction of %s: %s", self.transactional_id, err)
        finally:
            self._started = None

    def close(self) -> None:
        """Flush briefly and close; a fenced or fatal producer has nothing left to deliver."""
        if self._producer is not None:
            _close(self._producer)
            self._producer = None

    # ------------------------------------------------------------------ errors
    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None and self._failed_delivery is None:
            self._delivery_error = err if isinstance(err, KafkaError) else None
            self._failed_delivery = (
                f"record key {msg.key()!r} to topic {msg.topic()} partition {msg.partition()} "
                f"failed: {err.str() if hasattr(err, 'str') else err}"
            )

    def _failure(self, e: KafkaException, phase: str, kind: Outcome | None = None) -> TxnError:
        """Classify, do what the class requires (abort, replace the producer, give up on it), return the error."""
        err: KafkaError = self._root_cause(e.args[0])
        if self._delivery_error is not None and self._delivery_error.code() in CONFIG_CODES:
            # "n message(s) failed delivery": a write the broker refused (no ACL on the topic) is what to fix
            err, kind = self._delivery_error, Outcome.CONFIG
        elapsed = self.elapsed_ms
        kind = kind or classify(err, phase=phase, elapsed_ms=elapsed, timeout_ms=self.timeout_ms)
        detail = f"; {self._failed_delivery}" if self._failed_delivery else ""
        message = f"{phase} in a transaction of {self.transactional_id} failed: {err.str()}{detail}"
        message += _meaning(kind, err, elapsed, self.timeout_ms)
        exc = _CLASSES[kind](message, err, phase, elapsed)
        if kind in (Outcome.FENCED, Outcome.FATAL):
            self._dead, self._started = exc, None  # never abort or re-initialise a fenced producer
        elif kind == Outcome.OUTCOME_UNKNOWN:
            self._started = None
            self._replace(message)
        elif phase != "init":
            self.abort()
        return exc

    def _root_cause(self, err: KafkaError) -> KafkaError:
        """produce() on a producer already in librdkafka's fatal state reports only `_FATAL` ("Unable to produce
        message: Local: Fatal error"); the transactional API returns the error that made it fatal, e.g. `_FENCED`
        when a newer instance fenced it between two batches. Fencing must be told from other fatal errors: a
        fenced job stops, a fatal one restarts."""
        if err.code() != KafkaError._FATAL or self._producer is None:
            return err
        try:
            self._producer.abort_transaction(1.0)
        except KafkaException as e:
            cause: KafkaError = e.args[0]
            if cause.code() != KafkaError._FATAL:
                return cause
        return err

    def _replace(self, why: str) -> None:
        """A new producer with the same transactional.id, initialised before anything else can be written: its
        InitProducerId waits for the old producer's pending commit or abort, and fences the old epoch."""
        old, self._producer = self._producer, None
        try:
            self._producer = self._initialised(self._make())
        except TxnError as e:
            self._dead = e
            raise
        if old is not None:
            _close(old, purge=True)
        log.warning("replaced the producer of %s: %s", self.transactional_id, why)
        if self._on_event is not None:
            self._on_event(wire.PRODUCER_REPLACED, {"transactional_id": self.transactional_id, "why": why[:500]})

    def _initialised(self, producer: Producer) -> Producer:
        """init_transactions: fences the previous incarnation and aborts its open transaction; retriable errors are
        tried again within init_timeout_s."""
        deadline = self._clock() + self.init_timeout_s
        while True:
            try:
                producer.init_transactions(max(1.0, deadline - self._clock()))
                return producer
            except KafkaException as e:
                err = e.args[0]
                kind = classify(err, phase="init", elapsed_ms=None, timeout_ms=self.timeout_ms)
                if kind == Outcome.RETRIABLE and self._clock() < deadline:
                    self._sleep(RETRY_PAUSE_S)
                    continue
                _close(producer)
                message = f"init_transactions of {self.transactional_id} failed: {err.str()}"
                message += _meaning(kind, err, None, self.timeout_ms)
                raise _CLASSES[kind if kind != Outcome.RETRIABLE else Outcome.FATAL](message, err, "init") from e


def _close(producer: Producer, purge: bool = False) -> None:
    try:
        if purge:
            producer.purge(in_queue=True, in_flight=False)
        producer.flush(10)
        producer.close()
    except (KafkaException, RuntimeError) as e:
        log.info("closing a transactional producer: %s", e)
