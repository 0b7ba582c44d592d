"""Files holding secrets are their owner's only from the moment they exist, whatever the umask or a leftover file."""

import os
import stat

import pytest

from onceflow_dev.private_files import write_private


@pytest.fixture
def open_umask():
    old = os.umask(0)  # the worst case: files created world-writable unless the code says otherwise
    yield
    os.umask(old)


def _mode(p):
    return stat.S_IMODE(p.stat().st_mode)


def test_a_secret_file_is_0600_from_creation_even_with_umask_0(tmp_path, open_umask, monkeypatch):
    target = tmp_path / "d" / "credentials.json"
    modes = []
    real_replace = os.replace

    def spy(src, dst):  # the temporary file, just before it takes the name: already 0600 and complete
        modes.append((_mode(type(target)(src)), type(target)(src).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_private(target, "s3cret")
    assert modes == [(0o600, "s3cret")] and _mode(target) == 0o600 and target.read_text() == "s3cret"


def test_rewriting_a_world_readable_file_makes_it_private_and_leaves_no_temporary(tmp_path, open_umask):
    target = tmp_path / "server.properties"
    target.write_text("old")
    target.chmod(0o644)
    write_private(target, "new")
    assert _mode(target) == 0o600 and target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["server.properties"]


def test_the_stacks_secret_stores_use_it(tmp_path, open_umask):
    from onceflow import config
    from onceflow_dev import airflow_local, credentials

    s = config.load(env={}, var_dir=tmp_path)
    credentials.ensure(s)
    airflow_local.password(s)
    assert _mode(credentials.path(s)) == 0o600 and _mode(airflow_local.password_file(s)) == 0o600
