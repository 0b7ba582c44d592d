"""Which savepoints to keep: the Flink Kubernetes operator's history rules, as a pure function.

Keep the newest `keep` complete savepoints, and none older than `max_age_s`, except the newest, which is kept
whatever its age (a job must always have a point to go back to). A savepoint without a manifest is one being
written, or one abandoned by a crash: it is left alone for `incomplete_grace_s`, then deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SavepointInfo:
    id: str
    created_ms: int
    complete: bool
    ledger_batch: int | None = None


@dataclass
class RetentionPlan:
    keep: list[str] = field(default_factory=list)
    delete: list[tuple[str, str]] = field(default_factory=list)  # (id, why)

    @property
    def delete_ids(self) -> list[str]:
        return [i for i, _ in self.delete]


def plan(
    savepoints: Iterable[SavepointInfo], now_ms: int, keep: int, max_age_s: float, incomplete_grace_s: float = 3600.0
) -> RetentionPlan:
    if keep < 1:
        raise ValueError("keep must be >= 1: the newest savepoint is always kept")
    out = RetentionPlan()
    items = list(savepoints)
    complete = sorted(
        (s for s in items if s.complete), key=lambda s: (s.created_ms, s.ledger_batch or -1, s.id), reverse=True
    )
    for i, s in enumerate(complete):
        age_s = (now_ms - s.created_ms) / 1000
        if i == 0:
            out.keep.append(s.id)
        elif i >= keep:
            out.delete.append((s.id, f"beyond the newest {keep}"))
        elif age_s > max_age_s:
            out.delete.append((s.id, f"older than {max_age_s:.0f} s ({age_s:.0f} s)"))
        else:
            out.keep.append(s.id)
    for s in sorted((s for s in items if not s.complete), key=lambda s: s.created_ms):
        age_s = (now_ms - s.created_ms) / 1000
        if age_s > incomplete_grace_s:
            out.delete.append((s.id, f"incomplete (no manifest) for {age_s:.0f} s"))
        else:
            out.keep.append(s.id)
    return out
