"""The benches' Stamper runs in a process of its own (not a thread beside the live feeds' producers): it hands its
stamps back when stopped, and a stamper that failed says so rather than leave a latency row of no results."""

import pytest

from onceflow import config
from onceflow.runtime import procs
from onceflow_dev.stamper import Stamper


def settings(**kw) -> config.Settings:
    # nothing listens on these ports: the stamper's process starts, reads nothing, and is stopped
    return config.load(env={}, bootstrap_servers=f"127.0.0.1:{procs.free_port()}", **kw)


def test_a_stopped_stamper_hands_back_its_stamps_from_its_own_process():
    st = Stamper(settings())
    st.start()
    assert st._proc is not None and st._proc.poll() is None, "the stamper reads in a process of its own"
    assert st.stop(60) == []
    assert st._proc.returncode == 0


def test_a_stamper_that_failed_is_an_error_not_an_empty_row():
    st = Stamper(settings(sink_kind="postgres", postgres_port=procs.free_port()))  # no server: connect fails
    st.start()
    with pytest.raises(RuntimeError, match="without its stamps"):
        st.stop(60)


@pytest.mark.parametrize("phase", ["bench_quiet", "bench_latency"])
def test_a_contender_that_fails_is_the_error_seen_and_its_stamper_is_stopped(monkeypatch, phase):
    from onceflow_dev import bench, bench_quiet

    stampers: list[Stamper] = []

    class FailingStamper(Stamper):  # a stamper that would fail too, as it does when the broker is gone
        def __init__(self, s):
            super().__init__(s)
            stampers.append(self)

        def stop(self, timeout):
            raise RuntimeError("the stamper's own error")

    class BrokenContender:
        name = "broken"
        stopped = False

        def start(self):
            raise ValueError("the contender's error")

        def stop(self):
            self.stopped = True

    monkeypatch.setattr(bench_quiet, "Stamper", FailingStamper)
    monkeypatch.setattr(bench, "Stamper", FailingStamper)
    c, s = BrokenContender(), settings()
    with pytest.raises(ValueError, match="the contender's error"):
        if phase == "bench_quiet":
            bench_quiet.quiet(c, s)  # type: ignore[arg-type]
        else:
            bench.latency(c, s, bench.BenchSpec())  # type: ignore[arg-type]
    assert c.stopped or phase == "bench_latency", "bench_quiet stops its contender (bench's callers stop theirs)"
    (st,) = stampers
    assert st._proc is not None and st._proc.returncode is not None, "the stamper's process is not left running"


class LibrdkafkaLikeConsumer:
    """consume(n, timeout) as librdkafka's batch consume behaves: it returns once it holds n messages or its timeout
    has passed, so a call with fewer than n queued and a timeout blocks; poll(timeout) returns on the first message."""

    def __init__(self, queued: list[str]):
        self.queued = list(queued)
        self.blocked_s = 0.0  # how long the calls would have waited with messages already queued

    def poll(self, timeout):
        if not self.queued:
            return None
        return self.queued.pop(0)

    def consume(self, num_messages, timeout):
        if self.queued and len(self.queued) < num_messages:
            self.blocked_s += timeout
        got, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return got


def test_the_stamper_takes_the_last_results_of_a_commit_without_waiting_out_a_timeout():
    # a window's 9,150 results committed at once: the stamper's first read takes 5,000, the next the other 4,150
    from onceflow_dev.stamper import arrived

    c = LibrdkafkaLikeConsumer([f"r{i}" for i in range(9150)])
    first, second, third = arrived(c, 0.2), arrived(c, 0.2), arrived(c, 0.2)
    assert (len(first), len(second), third) == (5001, 4149, [])
    assert c.blocked_s == 0.0, "the last results of a commit waited out the timeout before they were stamped"
