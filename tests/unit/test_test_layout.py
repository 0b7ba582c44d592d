"""Tests mirror the code: shared fixtures and helpers live in tests/support; no test module imports another test
module or another test folder (each stays readable, and runnable, on its own)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_imports_from_another_test_module_or_folder():
    wrong = []
    for path in TESTS.rglob("*.py"):
        if "support" in path.relative_to(TESTS).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: a sibling test module
                wrong.append(f"{path.relative_to(TESTS)}: from {'.' * node.level}{node.module or ''} import ...")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
                if not node.module.startswith("tests.support"):
                    wrong.append(f"{path.relative_to(TESTS)}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{path.relative_to(TESTS)}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("tests.") and not a.name.startswith("tests.support")
                ]
    assert not wrong, wrong
