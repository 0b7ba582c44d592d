"""docs/configuration.md is what onceflow.config says: every setting, with something that says what it does."""

import dataclasses
import difflib

from onceflow import config
from onceflow_dev import config_reference

DOC = config.REPO_ROOT / "docs" / "configuration.md"


def test_every_setting_says_what_it_does():
    assert config_reference.undocumented() == [], (
        "comment these settings in include/onceflow/config.py (the lines right above the field), then `make docs`"
    )


def test_the_reference_is_generated_from_the_settings_as_they_are():
    text, now = DOC.read_text(), config_reference.render()
    diff = "".join(
        difflib.unified_diff(
            text.splitlines(keepends=True), now.splitlines(keepends=True), "docs/configuration.md", "generated", n=1
        )
    )
    assert text == now, f"docs/configuration.md is stale: run `make docs`\n{diff[:3000]}"


def test_every_setting_has_its_row_with_its_variable():
    text = DOC.read_text()
    for f in dataclasses.fields(config.Settings):
        row = f"| `{f.name}` | `{config.ENV_PREFIX}{f.name.upper()}` |"
        assert row in text, f"{f.name} has no row in docs/configuration.md: run `make docs`"


def test_the_reference_is_the_same_on_every_machine(monkeypatch):
    before = config_reference.render()
    monkeypatch.setenv("ONCEFLOW_VAR_DIR", "/elsewhere/var")
    monkeypatch.setenv("ONCEFLOW_TRANSACTION_TIMEOUT_MS", "1234")
    assert config_reference.render() == before  # the source's defaults, not this environment's settings
    assert str(config.REPO_ROOT) not in before  # no path of this machine
    assert "(empty; secret" in before  # the password's default says it is a secret, shows nothing
