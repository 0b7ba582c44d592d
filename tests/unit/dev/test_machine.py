"""The machine stamp every bench results file carries (onceflow_dev.machine)."""

import itertools

from onceflow_dev import machine


def test_describe_names_the_cpu_and_times_both_workloads():
    d = machine.describe()
    assert d["cores"] >= 1 and d["python"].count(".") == 2
    assert d["cpu_model"] and d["cpu_model"] != "unknown"
    cal = d["calibration_cpu_s"]
    assert set(cal) == {"python_loop", "sha256_256mb"} and all(v > 0 for v in cal.values())


def test_cpu_s_keeps_the_least_disturbed_run(monkeypatch):
    # three runs reading 0.5, 0.2 and 0.9 CPU seconds: the figure is the fastest
    ticks = itertools.chain([0.0, 0.5], [1.0, 1.2], [2.0, 2.9])
    monkeypatch.setattr(machine.time, "process_time", lambda: next(ticks))
    assert machine.cpu_s(lambda: None) == 0.2


def test_cpu_model_without_cpuinfo_falls_back(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU @ 1.00GHz\n")
    assert machine.cpu_model(tmp_path / "cpuinfo") == "Test CPU @ 1.00GHz"
    assert machine.cpu_model(tmp_path / "missing") != ""
