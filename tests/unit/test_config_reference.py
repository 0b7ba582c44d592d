"""docs/configuration.md is what onceflow.config says: every setting, with a comment that says what it does."""

import dataclasses

from onceflow import config
from onceflow_dev import config_reference

DOC = config.REPO_ROOT / "docs" / "configuration.md"


def test_every_setting_says_what_it_does():
    assert config_reference.undocumented() == [], "comment these settings in include/onceflow/config.py"


def test_the_reference_is_generated_from_the_settings_as_they_are():
    text = DOC.read_text()
    assert text == config_reference.render(), "docs/configuration.md is stale: run `make docs`"
    for f in dataclasses.fields(config.Settings):
        assert f"`{config.ENV_PREFIX}{f.name.upper()}`" in text, f.name
    assert str(config.REPO_ROOT) not in text  # no path of this machine
