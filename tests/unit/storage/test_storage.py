"""The one store (onceflow.storage.store.Store): a checkpoint on a store that is not the local disk is read and
judged the same way (fsspec's in-memory file system stands in for a remote one)."""

import time
import uuid

from onceflow import config
from onceflow.control import health
from onceflow.storage.store import Store


def test_a_remote_checkpoint_is_read_and_its_age_judged_by_health():
    uri = f"memory://onceflow-{uuid.uuid4().hex[:8]}/checkpoints/app"
    store = Store(uri)
    s = config.load(env={}, checkpoint_uri=uri)
    assert health.checkpoint_age_s(s, time.time()) is None  # no commit yet
    store.write("commits/0", b"v1\n{}\n")
    store.write("sources/0/0", b"\x00v1\n{}\n")
    assert store.read_text("commits/0") == "v1\n{}\n" and store.read_text("commits/9") is None
    age = health.checkpoint_age_s(s, time.time() + 30)
    assert age is not None and 29 <= age <= 60


def test_a_local_checkpoint_is_the_same_store(tmp_path):
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "3").write_text("v1")
    assert Store(tmp_path.as_uri()).read_text("commits/3") == "v1"
    newest = Store(str(tmp_path)).newest_mtime("commits")
    assert newest is not None and abs(newest - (tmp_path / "commits" / "3").stat().st_mtime) < 1
