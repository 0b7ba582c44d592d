"""One form for each state: the status families are enums shared by the library and the DAGs, and no code compares
a status, state, action, verdict, mode or severity with a string literal (issue 29)."""

import ast
from enum import StrEnum
from pathlib import Path

import pytest

from onceflow import wire
from onceflow.control import alerts, deploy, health, rotation, triggers
from onceflow.kafka import transactional
from onceflow.rules import lag
from onceflow.rules import reconciliation as rr

ROOT = Path(__file__).resolve().parents[3]
FAMILIES = [
    lag.Level,
    lag.Trend,
    rr.Status,
    rr.Mode,
    rr.Verdict,
    health.State,
    health.Action,
    alerts.Status,
    alerts.Severity,
    wire.JobState,
    wire.Intent,
    deploy.Action,
    rotation.Action,
    rotation.Result,
    triggers.Fired,
    transactional.Outcome,
]
FIELDS = {"status", "state", "action", "verdict", "mode", "severity", "desired"}


def _field(node: ast.expr) -> str | None:
    """The state-like field an expression reads: `x.status`, `x["status"]`, `x.get("status")`."""
    if isinstance(node, ast.Attribute):
        # argparse's sub-command (`args.action`) is the CLI's grammar, not a state
        return None if isinstance(node.value, ast.Name) and node.value.id == "args" else node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        return str(first.value) if isinstance(first, ast.Constant) else None
    return None


def _literals(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for e in node.elts for v in _literals(e)]
    return []


def literal_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        fields = {f for f in map(_field, sides) if f in FIELDS}
        words = [w for s in sides for w in _literals(s)]
        if fields and words:
            found.append(f"{path.relative_to(root)}:{node.lineno} {sorted(fields)} against {words}")
    return found


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_each_state_family_is_a_string_enum_whose_values_are_its_wire_form(family):
    assert issubclass(family, StrEnum)
    for member in family:
        assert str(member) == member.value and f"{member}" == member.value  # written to files and topics as is


def test_no_library_module_or_dag_compares_a_state_with_a_string_literal():
    files = sorted((ROOT / "include" / "onceflow").rglob("*.py")) + sorted((ROOT / "dags").glob("*.py"))
    found = [hit for f in files for hit in literal_comparisons(f)]
    assert found == [], "\n".join(found)


def test_the_finder_sees_each_form_of_a_literal_comparison(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        'a.status == "ok"\nb["state"] != "x"\nc.get("action") in ("y", "z")\nd.kind == "fine"\nargs.action == "up"\n'
    )
    assert [h.split(" ", 1)[1] for h in literal_comparisons(src, tmp_path)] == [
        "['status'] against ['ok']",
        "['state'] against ['x']",
        "['action'] against ['y', 'z']",
    ]
