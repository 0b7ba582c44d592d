"""The benches' CPU accounting (onceflow_dev.bench.usage): a process group's CPU includes the short processes its
members fork and reap (a JVM's `chmod` per file it creates), not only the members alive at the reading."""

import subprocess
import sys
import time

import pytest

from onceflow_dev import bench

# the group's leader runs a child that burns 0.6 s of CPU and ends, then idles: only its reaped time holds the child's
LEADER = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"])
print("reaped", flush=True)
time.sleep(30)
"""


def test_usage_counts_the_cpu_of_children_a_member_has_reaped():
    p = subprocess.Popen([sys.executable, "-c", LEADER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "reaped"
        deadline = time.monotonic() + 10
        while (cpu := bench.usage(p.pid)["cpu_s"]) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu >= 0.6, f"the group's CPU {cpu} s leaves out its reaped child's 0.6 s"
    finally:
        p.kill()
        p.wait()


def test_usage_of_no_process_is_zero():
    assert bench.usage(None)["cpu_s"] == 0


# stands in for a worker's executor: a process outside the job's group, named as Spark names it, that burns 0.6 s
EXECUTOR = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.6: pass
print("busy", flush=True)
time.sleep(30)
"""


def test_on_the_cluster_a_jobs_cpu_includes_the_executors_started_since_it_began():
    """On the cluster topology a job's tasks run in executors the workers start, outside the job's process group."""
    before = bench.boot_ticks_now()
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    argv = [sys.executable, "-c", EXECUTOR, "org.apache.spark.executor.CoarseGrainedExecutorBackend"]
    executor = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert executor.stdout is not None and executor.stdout.readline().strip() == "busy"
        assert executor.pid in bench.executor_pids(before)
        assert bench.usage(job.pid, before)["cpu_s"] >= 0.6
        assert bench.usage(job.pid)["cpu_s"] < 0.6  # one node: the group alone
        # an executor that was there before the job began is another job's
        assert executor.pid not in bench.executor_pids(bench.boot_ticks_now() + 100)
    finally:
        for p in (job, executor):
            p.kill()
            p.wait()


def test_the_bench_runs_on_one_node_or_on_the_loopback_cluster_and_refuses_anything_else():
    assert bench.BenchSpec(topology="cluster").runs("eos")
    # the loaded row's CPU would mix two jobs' executors
    assert not bench.BenchSpec(topology="cluster").runs("eos_loaded") and bench.BenchSpec().runs("eos_loaded")
    with pytest.raises(ValueError, match="BENCH_TOPOLOGY='three-nodes': one of one-node, cluster"):
        bench.BenchSpec(topology="three-nodes")
