"""A chaos, bench or soak run ended by SIGTERM (`kill`, `timeout`) runs its own teardown, so the stack of the seed
it was on does not outlive it (onceflow_dev.interrupt). Before it, SIGTERM to `make chaos-seeds` ended the process
at once and left that seed's brokers, Spark cluster and job listening."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from onceflow_dev import interrupt

REPO = Path(__file__).resolve().parents[3]

# chaos-seeds' own __main__, with a seed's run replaced by one that "starts a stack", says so, and stops it in its
# `finally`, as chaos.run stops its brokers and job.
SCRIPT = textwrap.dedent(
    """
    import runpy, sys, time
    from pathlib import Path
    from onceflow import config
    from onceflow_dev import chaos

    stopped = Path(sys.argv[1])

    def run(spec, var):
        try:
            print("stack up", flush=True)
            time.sleep(60)
        finally:
            stopped.write_text(f"stopped seed {spec.seed}")
        return {}

    config.REPO_ROOT = stopped.parent
    chaos.prepare_var = lambda: None
    chaos.run = run
    runpy.run_module("onceflow_dev.chaos_seeds", run_name="__main__")
    """
)


def test_sigterm_to_chaos_seeds_stops_the_stack_of_the_seed_it_is_on(tmp_path):
    stopped = tmp_path / "stopped"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'include'}:{REPO}", "CHAOS_SEEDS": "7 8"}
    env.pop("CHAOS_TOPOLOGY", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(stopped)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "stack up"  # blocks until the seed's run has begun
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert stopped.read_text() == "stopped seed 7"
    assert code == interrupt.EXIT_CODE


def test_a_second_sigterm_does_not_cut_the_teardown_short(tmp_path):
    stopped = tmp_path / "stopped"
    script = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from onceflow_dev import interrupt

        def main():
            try:
                print("up", flush=True)
                time.sleep(60)
            finally:
                print("tearing down", flush=True)
                time.sleep(1.5)  # a second SIGTERM arrives here
                Path(sys.argv[1]).write_text("stopped")
            return 0

        interrupt.run(main)
        """
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'include'}:{REPO}"}
    proc = subprocess.Popen([sys.executable, "-c", script, str(stopped)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "tearing down"
        time.sleep(0.2)  # inside the teardown's own wait: no condition to wait on but the signal's delivery
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert stopped.read_text() == "stopped"
    assert code == interrupt.EXIT_CODE
