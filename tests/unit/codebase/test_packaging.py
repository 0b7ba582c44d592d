"""onceflow is a real package: its wheel declares what it needs at run time and carries what it runs without a
checkout: the console's assets, what spark-submit launches, the driver's log4j2 configuration, the connector's pom,
the Java source of the checkpoint's local file system and of the shipped apps' JVM functions."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_wheel_declares_its_dependencies_and_carries_the_consoles_assets(tmp_path):
    src = tmp_path / "src"  # built from a copy: a build writes build/ and egg-info beside its sources
    shutil.copytree(ROOT / "include", src / "include", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(ROOT / "pyproject.toml", src)
    out = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*pip, "-w", str(out), str(src)], check=True, timeout=300, cwd=tmp_path)
    [wheel] = out.glob("onceflow-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "onceflow/control/console/icon.svg" in names
    assert "onceflow/control/console/app.py" in names and "onceflow_apps/ip_count.py" in names
    for runs in ("entrypoints/stream.py", "entrypoints/reconcile.py", "entrypoints/backfill.py"):
        assert f"onceflow/{runs}" in names, runs
    for data in (
        "log4j2-job.properties",
        "maven/settings.xml",
        "maven/spark-kafka/pom.xml",
        "java/NioLocalFileSystem.java",
    ):
        assert f"onceflow/resources/{data}" in names, data
    for java in ("rules/dev/onceflow/accesslog/Rules.java", "spark/dev/onceflow/accesslog/spark/ParseRecord.java"):
        assert f"onceflow_apps/access_log/java/{java}" in names, java  # the shipped apps' JVM functions
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    for need in ("confluent-kafka", "pyspark", "pandas"):
        assert any(r.startswith(need) and "extra ==" not in r for r in requires), (need, requires)
    assert any(r.startswith("apache-airflow") and 'extra == "airflow"' in r for r in requires), requires
    assert "onceflow = onceflow.cli:main" in entry_points and "onceflow-dev = onceflow_dev.cli:main" in entry_points

    # installed from the wheel, runtime state goes to the user's state directory, not beside site-packages
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {"PYTHONPATH": str(site), "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    probe = "from onceflow import config; s = config.Settings(); print(config.in_checkout(), s.var_dir, s.jvm_dir)"
    # -S: no site-packages, so this checkout's editable install cannot answer for the wheel
    out = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "False",
        str(tmp_path / "state" / "onceflow"),
        str(tmp_path / "home/.cache/onceflow/jvm"),
    ]


def test_nothing_the_platform_runs_is_found_through_the_checkouts_root():
    """What spark-submit launches and the files it needs are the package's, found from the package itself; only
    the development tooling (onceflow_dev) reaches into the checkout (its own poms, the embedded stack's var/)."""
    from onceflow import resources
    from onceflow.runtime import launcher

    package = ROOT / "include" / "onceflow"
    for path in (launcher.JOB_SCRIPT, launcher.RECONCILE_SCRIPT, launcher.BACKFILL_SCRIPT, launcher.LOG4J):
        assert path.is_file() and package in path.parents, path
    assert resources.MAVEN_SETTINGS.is_file() and (resources.MAVEN_POMS / "spark-kafka" / "pom.xml").is_file()
    assert not (ROOT / "jobs").exists() and not (ROOT / "conf").exists()
