"""Tests mirror the code: shared fixtures and helpers live in tests/support; no test module imports another test
module or another test folder (each stays readable, and runnable, on its own)."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


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


def test_unit_tests_are_grouped_by_the_package_they_test():
    """tests/unit/<package>/: rules, kafka, protocol, runtime, control, ... (dev: onceflow_dev; codebase: checks over
    the whole code), each a package of its own."""
    unit = TESTS / "unit"
    assert not list(unit.glob("test_*.py")), "a unit test module belongs in the folder of the package it tests"
    for folder in (p for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert (folder / "__init__.py").exists(), folder
        assert list(folder.glob("test_*.py")), f"{folder} holds no tests"
