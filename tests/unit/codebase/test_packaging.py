"""onceflow is a real package: its wheel declares what it needs at run time and carries the console's assets."""

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
    assert "onceflow/control/console/icon.svg" in names
    assert "onceflow/control/console/app.py" in names and "onceflow_apps/ip_count.py" in names
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    for need in ("confluent-kafka", "pyspark", "pandas"):
        assert any(r.startswith(need) and "extra ==" not in r for r in requires), (need, requires)
    assert any(r.startswith("apache-airflow") and 'extra == "airflow"' in r for r in requires), requires
