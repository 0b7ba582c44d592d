"""A running driver's stacks (onceflow.runtime.stacks): asked only of a live driver, read back from its log, and
the driver runs on. The processes are real; their command lines are a driver's or not."""

from __future__ import annotations

import json

from onceflow import config
from onceflow.runtime import stacks, supervisor

DUMP = """\
2026-11-30 05:01:02 INFO batch 12 begins
Thread 0x00007f53217b06c0 (most recent call first):
  File "/x/onceflow/kafka/transactional.py", line 317 in call
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "<frozen importlib._bootstrap>", line ??? in _find_and_load
2026-11-30 05:01:02 INFO interleaved from another thread

Current thread 0x00007f53225f7b80 (most recent call first):
  File "/x/onceflow/runtime/driver.py", line 301 in main
"""


def test_the_stacks_are_read_out_of_the_log_between_other_lines():
    got = stacks.parse(DUMP)
    assert len(got) == 2
    assert got[0].splitlines()[1].endswith("line 317 in call") and len(got[0].splitlines()) == 4
    assert got[1].startswith("Current thread") and got[1].endswith("in main")
    assert stacks.parse('no stacks here\n  File "a", line 1 in b\n') == []
    # where each thread waits in the platform's code, innermost first; a thread outside it is left out
    idle = 'Thread 0x01 (most recent call first):\n  File "/usr/lib/python3.11/selectors.py", line 415 in select'
    assert stacks.waiting_in([*got, idle]) == [
        "onceflow/kafka/transactional.py:317 in call",
        "onceflow/runtime/driver.py:301 in main",
    ]


def test_a_running_driver_writes_its_stacks_to_its_log_and_runs_on(driver):
    s, start = driver
    p = start(is_driver=True)
    supervisor.job_log(s).open("a").write("an older dump, not this one's:\n" + DUMP)
    dumped = stacks.dump(s, timeout_s=20)
    assert dumped and dumped.pid == p.pid and dumped.log == supervisor.job_log(s)
    got = dumped.threads
    assert got and all("(most recent call first):" in t for t in got)
    # this driver's own stacks, not the older dump's above them
    assert "stream.py" in "\n".join(got) and not any("transactional.py" in t for t in got)
    assert p.poll() is None  # it runs on


def test_onceflow_job_stacks_prints_them_and_says_when_no_driver_runs(driver, monkeypatch, capsys):
    from onceflow import cli

    s, start = driver
    monkeypatch.setenv("ONCEFLOW_VAR_DIR", str(s.var_dir))
    assert cli.main(["job", "stacks"]) == 1
    assert "no running driver" in capsys.readouterr().err
    p = start(is_driver=True)
    assert cli.main(["job", "stacks", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["pid"] == p.pid and got["threads"][0].endswith(" in <module>")
    assert p.poll() is None


def test_a_process_that_is_not_a_driver_is_never_signalled(driver):
    s, start = driver
    p = start(is_driver=False)  # the signal would end it
    assert stacks.driver_pid(s) is None and stacks.dump(s, timeout_s=1) is None
    assert p.poll() is None


def test_no_status_file_no_driver(tmp_path):
    s = config.load(env={}, app_id="a", var_dir=tmp_path)
    assert stacks.driver_pid(s) is None and stacks.dump(s, timeout_s=1) is None
