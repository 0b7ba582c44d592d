"""The batch pacing rules: close-out batches at once, otherwise the trigger cadence."""

from onceflow.rules.pacing import (
    BatchTiming,
    Lead,
    chase_at_ms,
    closes_windows,
    closing_event_ms,
    delay_before_next_s,
    lead_at_ms,
    next_watermark_ms,
)

W = D = 5000  # window and watermark delay, ms
T = 2000  # trigger interval, ms


def timing(wm: int, max_event: int | None, batch_ts: int = 100_000) -> BatchTiming:
    return BatchTiming(batch_ts_ms=batch_ts, watermark_ms=wm, max_event_ms=max_event)


def test_the_watermark_follows_the_newest_event_and_never_goes_back():
    assert next_watermark_ms(timing(10_000, 20_000), D) == 15_000
    assert next_watermark_ms(timing(10_000, 12_000), D) == 10_000
    assert next_watermark_ms(timing(10_000, None), D) == 10_000


def test_a_window_closes_when_the_new_watermark_reaches_its_end():
    # window [5000, 10000) is evicted once the watermark is >= 10000, i.e. an event at >= 15000 was read
    assert not closes_windows(timing(9_000, 14_999), D, W)
    assert closes_windows(timing(9_000, 15_000), D, W)
    assert closes_windows(timing(9_999, 15_000), D, W)
    # the watermark already stood at the window's end: that window went out with this batch
    assert not closes_windows(timing(10_000, 19_999), D, W)
    assert closes_windows(timing(10_000, 20_000), D, W)
    assert not closes_windows(timing(10_000, None), D, W)


def test_a_batch_that_closes_windows_is_followed_at_once():
    assert (
        delay_before_next_s(
            timing(9_000, 15_500, batch_ts=100_000), now_ms=100_300, trigger_ms=T, delay_ms=D, window_ms=W
        )
        == 0.0
    )


def test_otherwise_the_next_batch_starts_at_the_next_trigger_boundary():
    # planned at 100.4 s: the next multiple of 2 s is 102 s; it is now 100.9 s
    assert (
        delay_before_next_s(
            timing(9_000, 14_000, batch_ts=100_400), now_ms=100_900, trigger_ms=T, delay_ms=D, window_ms=W
        )
        == 1.1
    )
    # the batch ran past the boundary: no wait
    assert (
        delay_before_next_s(
            timing(9_000, 14_000, batch_ts=100_400), now_ms=102_500, trigger_ms=T, delay_ms=D, window_ms=W
        )
        == 0.0
    )
    # planned exactly on a boundary: the next one
    assert (
        delay_before_next_s(
            timing(9_000, 14_000, batch_ts=100_000), now_ms=100_000, trigger_ms=T, delay_ms=D, window_ms=W
        )
        == 2.0
    )


def test_replays_and_a_zero_trigger_never_wait():
    t = timing(9_000, 14_000, batch_ts=100_400)
    assert delay_before_next_s(t, now_ms=100_900, trigger_ms=T, delay_ms=D, window_ms=W, wrote=False) == 0.0
    assert delay_before_next_s(t, now_ms=100_900, trigger_ms=0, delay_ms=D, window_ms=W) == 0.0


def test_a_wall_clock_stepped_back_never_waits_more_than_one_trigger():
    # the batch was planned at 100.4 s; the clock has since been stepped back by an hour
    assert (
        delay_before_next_s(
            timing(9_000, 14_000, batch_ts=100_400), now_ms=100_400 - 3_600_000, trigger_ms=T, delay_ms=D, window_ms=W
        )
        == T / 1000
    )


def test_the_margin_plans_the_batch_after_the_boundary_event_has_arrived():
    # windows and the watermark delay are multiples of T: the event that closes a window is stamped on a multiple
    # of T (here 102 s) and reaches the broker a little after it; a batch planned on 102.0 s would not read it
    waiting = timing(9_000, 14_000, batch_ts=100_400)
    assert delay_before_next_s(waiting, now_ms=100_900, trigger_ms=T, delay_ms=D, window_ms=W, margin_ms=300) == 1.4
    # planned on the margin (100.3 s), the next batch is one trigger later (102.3 s), not at the multiple between
    on_margin = timing(9_000, 14_000, batch_ts=100_300)
    assert delay_before_next_s(on_margin, now_ms=100_500, trigger_ms=T, delay_ms=D, window_ms=W, margin_ms=300) == 1.8
    # a batch that started between the multiple and its margin (a close-out batch right after a boundary): the
    # next batch is at that margin, not a whole trigger later
    early = timing(9_000, 14_000, batch_ts=100_100)
    assert delay_before_next_s(early, now_ms=100_150, trigger_ms=T, delay_ms=D, window_ms=W, margin_ms=300) == 0.15
    # a margin never takes more than half the interval: 5 s counts as 1 s, so the next batch is at 101 s
    assert delay_before_next_s(waiting, now_ms=100_900, trigger_ms=T, delay_ms=D, window_ms=W, margin_ms=5_000) == 0.1


def test_a_closing_event_on_its_way_is_chased_once_its_lag_has_passed():
    """make bench's live phase (trigger and windows 5 s, margin 300 ms): the batch planned at 455.3 s read the
    stream up to 454.778 s, short of the event at 455.0 s that closes the window ending at 450 s. Without the chase
    that window waited for the batch at 460.3 s; with it the next batch is planned when the stream's lag (522 ms)
    has passed again after 455.0 s, plus the margin."""
    t5, m = 5000, 300
    missed = BatchTiming(batch_ts_ms=455_300, watermark_ms=445_799, max_event_ms=454_778)
    assert not closes_windows(missed, D, W) and closing_event_ms(missed, D, W) == 455_000
    assert chase_at_ms(missed, t5, D, W, m) == 455_000 + 522 + 300
    assert delay_before_next_s(missed, 455_600, t5, D, W, margin_ms=m, chase=True) == 0.222
    assert delay_before_next_s(missed, 455_600, t5, D, W, margin_ms=m) == 4.7  # not chasing: the cadence, 460.3 s


def test_no_chase_before_the_closing_moment_far_behind_it_or_without_events():
    t5, m = 5000, 300
    # a close-out batch right after its data batch: the next window cannot close before 460 s
    assert chase_at_ms(BatchTiming(455_900, 450_000, 455_800), t5, D, W, m) is None
    # a stream that trails the wall clock by half an interval or more (a backlog, producers far behind)
    assert chase_at_ms(BatchTiming(455_300, 445_000, 452_800), t5, D, W, m) is None
    assert chase_at_ms(BatchTiming(455_300, 445_000, 452_801), t5, D, W, m) == 455_000 + 2_499 + 300
    # nothing read, or the window closes anyway
    assert chase_at_ms(BatchTiming(455_300, 445_000, None), t5, D, W, m) is None
    assert chase_at_ms(BatchTiming(455_300, 445_000, 455_010), t5, D, W, m) is None
    # planned a second late (a slow batch before it), the stream 200 ms short of the closing event: the lag it saw
    # is 1.2 s, so the next batch is planned at 456.5 s
    late = BatchTiming(batch_ts_ms=456_000, watermark_ms=445_000, max_event_ms=454_800)
    assert chase_at_ms(late, t5, D, W, m) == 456_500
    assert delay_before_next_s(late, 456_100, t5, D, W, margin_ms=m, chase=True) == 0.4


def test_a_lead_batch_takes_the_intervals_input_before_the_boundary_batch():
    """make bench's live phase (trigger, windows and watermark delay 5 s, margin 150 ms, 5,000 records/s): after the
    close-out batch planned at 455.6 s, the boundary batch is due at 460.15 s and will read the event at 460 s that
    closes the window ending at 455 s. A lead batch 700 ms before it reads 3.85 s of the input, 19,250 records; then
    the boundary batch holds the last 700 ms only."""
    t5, m, lead = 5000, 150, Lead(700, 10_000, 5_000.0)
    close_out = BatchTiming(batch_ts_ms=455_600, watermark_ms=450_100, max_event_ms=455_580)
    assert not closes_windows(close_out, D, W) and closing_event_ms(close_out, D, W) == 460_000
    assert lead_at_ms(close_out, 460_150, t5, D, W, lead) == 459_450
    assert delay_before_next_s(close_out, 455_900, t5, D, W, margin_ms=m, lead=lead) == 3.55
    assert delay_before_next_s(close_out, 455_900, t5, D, W, margin_ms=m) == 4.25  # no lead: the cadence
    # after the lead batch, the boundary batch at its time: never a lead batch before a lead batch
    led = BatchTiming(batch_ts_ms=459_450, watermark_ms=450_580, max_event_ms=459_440)
    assert lead_at_ms(led, 460_150, t5, D, W, lead) is None
    assert delay_before_next_s(led, 459_800, t5, D, W, margin_ms=m, lead=lead) == 0.35
    # a lead batch that ran past the boundary batch's time: the boundary batch at once
    assert delay_before_next_s(led, 460_300, t5, D, W, margin_ms=m, lead=lead) == 0.0


def test_no_lead_batch_for_a_quiet_stream_a_stream_far_behind_or_no_closing_window():
    t5 = 5000
    close_out = BatchTiming(batch_ts_ms=455_600, watermark_ms=450_100, max_event_ms=455_580)
    # 200 records/s: 770 records, not worth a batch's fixed cost; lead batches off; the rate not known yet
    assert lead_at_ms(close_out, 460_150, t5, D, W, Lead(700, 10_000, 200.0)) is None
    assert lead_at_ms(close_out, 460_150, t5, D, W, Lead(0, 10_000, 5_000.0)) is None
    assert lead_at_ms(close_out, 460_150, t5, D, W, Lead(700, 10_000, None)) is None
    # the stream trails the wall clock by half an interval or more (a backlog, a replay), or the batch read no event
    behind = BatchTiming(batch_ts_ms=455_600, watermark_ms=445_000, max_event_ms=453_100)
    assert lead_at_ms(behind, 460_150, t5, D, W, Lead(700, 10_000, 5_000.0)) is None
    nothing = BatchTiming(batch_ts_ms=455_600, watermark_ms=450_100, max_event_ms=None)
    assert lead_at_ms(nothing, 460_150, t5, D, W, Lead(700, 10_000, 5_000.0)) is None
    # windows of a minute: the batch at 460.15 s closes none, so it needs no lead
    assert lead_at_ms(close_out, 460_150, t5, D, 60_000, Lead(700, 10_000, 5_000.0)) is None
    # a lead never takes more than half the interval: 5 s counts as 2.5 s
    assert lead_at_ms(close_out, 460_150, t5, D, W, Lead(5_000, 10_000, 5_000.0)) == 457_650
