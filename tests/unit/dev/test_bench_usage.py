"""The benches' CPU accounting (onceflow_dev.bench.usage): a process group's CPU includes the short processes its
members fork and reap (a JVM's `chmod` per file it creates), not only the members alive at the reading."""

import subprocess
import sys
import time

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
