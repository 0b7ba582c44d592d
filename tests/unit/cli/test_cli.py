"""The command line's own surface."""

import pytest


def test_the_cli_says_its_version(capsys):
    from importlib import metadata

    from onceflow import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"onceflow {metadata.version('onceflow')}"
