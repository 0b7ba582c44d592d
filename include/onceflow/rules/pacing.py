"""When the job starts its next micro-batch: the trigger cadence plus close-out batches (pure, no Spark).

Spark evicts a window with the watermark of the *previous* batch: the batch that first reads an event past a
window's end + watermark delay only raises the watermark, and the window is emitted by the batch after it. Under
a `ProcessingTime(T)` trigger that next batch starts up to T later, so a result waits up to 2T after its window
could close, plus two batches' processing.

With close-out on, the job runs Spark's trigger at 0 and paces batches itself, after each batch's transaction:
- a batch whose input moved the watermark past a window end is followed at once by the next batch (the
  close-out batch, which emits those windows, with whatever input arrived meanwhile);
- otherwise the next batch starts at the next multiple of T after this batch's start, like Spark's own trigger,
  plus a margin (`trigger_margin_ms`, at most T/2). With windows and watermark delay multiples of T, the event
  that closes a window is stamped on a multiple of T, and a batch planned on that multiple has not read it yet:
  it is still in its producer's linger or on the wire. The window then waited one more trigger interval; a batch
  planned a margin later reads it, and its close-out batch emits the window;
- a batch planned after the moment its next window could close (by the wall clock) whose newest event is still
  short of the closing event, by less than half an interval: the closing event is on its way (a producer's linger
  or a busy broker held the stream back by more than the margin). The next batch runs once the stream's lag
  behind the wall clock, as this batch saw it, has passed again after the closing moment, plus the margin: once per
  window, then the cadence again. In `make bench`'s live phase (239 windows) this was how the p99's late windows were
  late: each boundary batch read the stream 12 to 596 ms short of the closing event, and the window waited an interval
  (docs/performance.md, "A closing event on its way");
- a lead batch: when the batch planned a margin after the next boundary will read a window's closing event, and
  the input arriving until then is large (at least `lead_batch_min_records` records by the rate the batch saw), one
  more batch is planned `lead_batch_ms` before that boundary batch. It reads the bulk of the interval, so the boundary
  batch holds only the input of those last milliseconds: the window's result waits for it and the close-out batch,
  two small batches, instead of one that holds the interval's input. It costs a batch's fixed cost per interval,
  which a quiet stream below the threshold does not pay (docs/performance.md, "A lead batch");
- replays and catch-up batches (nothing new to write) are followed at once.
This changes when batches run, never what they contain: each batch's range, the results and the protocol are
the same as under any other schedule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchTiming:
    batch_ts_ms: int  # when Spark planned the batch (offsets/N batchTimestampMs)
    watermark_ms: int  # the watermark the batch evicted with (offsets/N batchWatermarkMs)
    max_event_ms: int | None  # the newest event time the batch read; None when unknown or no valid event


def next_watermark_ms(t: BatchTiming, delay_ms: int) -> int:
    """The watermark Spark computes after the batch (it never goes back)."""
    if t.max_event_ms is None:
        return t.watermark_ms
    return max(t.watermark_ms, t.max_event_ms - delay_ms)


def closes_windows(t: BatchTiming, delay_ms: int, window_ms: int) -> bool:
    """Does the next batch evict a window the batch did not? Spark evicts window [s, e) once watermark >= e;
    windows are aligned to the epoch, so that is a multiple of window_ms in (old watermark, new watermark]."""
    new = next_watermark_ms(t, delay_ms)
    return new > t.watermark_ms and (new // window_ms) * window_ms > t.watermark_ms


def closing_event_ms(t: BatchTiming, delay_ms: int, window_ms: int) -> int:
    """The event time that closes the next window the batch leaves open: that window's end plus the delay."""
    return (next_watermark_ms(t, delay_ms) // window_ms + 1) * window_ms + delay_ms


def live_lag_ms(t: BatchTiming, trigger_ms: int) -> int | None:
    """How far the newest event the batch read trailed its planning, by the wall clock, when that is under half an
    interval (a live stream); None when it read no event or trails by more (a backlog, a replay, producers far
    behind: there it is the cadence that paces, with neither a chase nor a lead batch)."""
    if t.max_event_ms is None:
        return None
    lag = t.batch_ts_ms - t.max_event_ms
    return lag if lag < trigger_ms // 2 else None


def chase_at_ms(t: BatchTiming, trigger_ms: int, delay_ms: int, window_ms: int, margin_ms: int) -> int | None:
    """When to plan a batch for a closing event still on its way (see the module's docstring), or None: the batch
    was planned before the closing moment, or its stream is not live (live_lag_ms)."""
    lag = live_lag_ms(t, trigger_ms)
    if lag is None or closes_windows(t, delay_ms, window_ms):
        return None
    closing = closing_event_ms(t, delay_ms, window_ms)
    if t.batch_ts_ms < closing:
        return None
    return closing + lag + margin_ms


@dataclass(frozen=True)
class Lead:
    """A lead batch's settings and the input rate it is decided on (see the module's docstring)."""

    lead_ms: int  # how long before the boundary batch the lead batch is planned; 0: never
    min_records: int  # the fewest records worth a lead batch
    records_per_s: float | None  # the input rate the batch saw: its records over the time since the batch before


def lead_at_ms(
    t: BatchTiming, boundary_ms: int, trigger_ms: int, delay_ms: int, window_ms: int, lead: Lead
) -> int | None:
    """When to plan a lead batch ahead of the batch planned at `boundary_ms`, or None: the lead is off or the rate
    unknown; the stream is not live (live_lag_ms); the batch at `boundary_ms` will not read a window's closing
    event (windows longer than the trigger); or the lead batch would read fewer than `lead.min_records` records
    (a quiet stream: a batch's fixed cost for nothing)."""
    lead_ms = min(lead.lead_ms, trigger_ms // 2)
    if lead_ms <= 0 or lead.records_per_s is None or live_lag_ms(t, trigger_ms) is None:
        return None
    if closing_event_ms(t, delay_ms, window_ms) > boundary_ms:
        return None
    at = boundary_ms - lead_ms
    if at <= t.batch_ts_ms or lead.records_per_s * (at - t.batch_ts_ms) / 1000 < lead.min_records:
        return None
    return at


def delay_before_next_s(
    t: BatchTiming,
    now_ms: int,
    trigger_ms: int,
    delay_ms: int,
    window_ms: int,
    wrote: bool = True,
    margin_ms: int = 0,
    chase: bool = False,
    lead: Lead | None = None,
) -> float:
    """Seconds to wait before letting Spark plan the next batch: until the next multiple of the trigger plus the
    margin after the batch's start, or sooner for a closing event on its way (`chase`: not yet done for this
    window, chase_at_ms) or for a lead batch ahead of that boundary batch (`lead`, lead_at_ms); never more than one
    trigger interval, whatever the wall clock does (a clock stepped back between the batch's start and now must not
    stall the job)."""
    if not wrote or trigger_ms <= 0 or closes_windows(t, delay_ms, window_ms):
        return 0.0
    margin_ms = min(margin_ms, trigger_ms // 2)
    at = ((t.batch_ts_ms - margin_ms) // trigger_ms + 1) * trigger_ms + margin_ms
    chased = chase_at_ms(t, trigger_ms, delay_ms, window_ms, margin_ms) if chase else None
    if chased is not None:
        at = min(at, chased)
    elif lead is not None and (lead_at := lead_at_ms(t, at, trigger_ms, delay_ms, window_ms, lead)) is not None:
        at = lead_at
    return min(trigger_ms, max(0, at - now_ms)) / 1000.0
