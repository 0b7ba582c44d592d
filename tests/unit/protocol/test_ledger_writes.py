"""An operator's ledger record (a restore, a quarantine) whose commit outcome is unknown is read back before the
caller undoes anything: a record that landed is committed, not undone (protocol review N-6)."""

import pytest

from onceflow import config
from onceflow.kafka.transactional import OutcomeUnknown, TransactionalWriter
from onceflow.protocol import ledger_writes


class Writer:
    """The TransactionalWriter's surface commit_record uses; the commit times out (the producer was replaced)."""

    transaction = TransactionalWriter.transaction  # the writer's own, on this stub's begin/commit/abort

    def __init__(self):
        self.calls = []

    def begin(self):
        self.calls.append("begin")

    def produce(self, topic, key, value, headers):
        self.calls.append(("produce", topic, key, value))

    def commit(self):
        self.calls.append("commit")
        raise OutcomeUnknown("commit timed out; replaced, its transaction settled", None, "commit")

    def abort(self):
        self.calls.append("abort")


S = config.load(env={})


def test_an_unknown_outcome_that_landed_is_a_commit():
    asked = []
    w = Writer()
    ledger_writes.commit_record(w, S, b'{"kind":"quarantine"}', "quarantine", landed=lambda s, v: asked.append(v) or 1)
    assert asked == [b'{"kind":"quarantine"}'] and "abort" not in w.calls


def test_an_unknown_outcome_that_did_not_land_raises_so_the_caller_undoes_its_change():
    with pytest.raises(OutcomeUnknown):
        ledger_writes.commit_record(Writer(), S, b"{}", "restore", landed=lambda s, v: False)
