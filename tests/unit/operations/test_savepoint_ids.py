"""Savepoint ids come from operators (CLI, DAG Params, the console) and are joined to a storage path: only ids
exactly as onceflow generates them (or `latest` where accepted) get through, at every layer (security issue 24)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from onceflow import cli, config
from onceflow.operations import savepoints
from onceflow.rules.savepoints import (
    DATA_DIR,
    MANIFEST,
    SAVEPOINT_ID_PATTERN,
    SAVEPOINT_REF_PATTERN,
    FileEntry,
    Manifest,
    SavepointError,
    SavepointIdError,
    check_id,
    savepoint_uri,
)
from onceflow.rules.sources import on_topic
from tests.support import dags

GOOD = "sp-20261122T010000000Z-b5"
OTHER = "sp-20261122T020000000Z-b7"

BAD = [
    "",
    "../x",
    "sp-x/../..",
    "sp-x",
    "/etc",
    "file:///etc",
    "sp-x/",
    f"{GOOD}/",
    f"{GOOD}/..",
    f"{GOOD}/../{OTHER}",
    "sp-x\\..",
    f"{GOOD}\\..",
    "%2e%2e",
    "sp-%2e%2e",
    f"{GOOD}\x00",
    "sp-\x00",
    f"{GOOD}\n",
    f" {GOOD}",
    f"{GOOD} ",
    "sp-20261122T010000000Z-b 5",
    "sp-20261122T010000000Z-b" + "9" * 5000,
    "sp-" + "1" * 10_000,
    "sp-２０２６1122T010000000Z-b5",  # fullwidth digits: \d would take them
    "SP-20261122T010000000Z-b5",
    "sp-20261122T010000000Z-b-1",
    "Latest",
    "latest/..",
    None,
    5,
]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_anything_but_a_generated_id_is_refused_with_what_an_id_looks_like(bad):
    for allow_latest in (False, True):
        with pytest.raises(SavepointIdError, match=r"invalid savepoint id .*: a savepoint id is sp-<YYYYMMDD>") as e:
            check_id(bad, allow_latest=allow_latest)
        assert isinstance(e.value, ValueError) and isinstance(e.value, SavepointError)
        assert len(str(e.value)) < 400  # a huge input is not echoed back whole
    for pattern in (SAVEPOINT_ID_PATTERN, SAVEPOINT_REF_PATTERN):  # as jsonschema applies a Param's pattern
        assert not isinstance(bad, str) or re.search(pattern, bad) is None


def test_generated_ids_and_latest_where_allowed_pass():
    for n, batch in [(0, 0), (1_763_773_200_123, 5), (4_102_444_799_999, 10**18)]:
        sp_id = savepoints.new_id(batch, n)
        assert check_id(sp_id) == sp_id and re.search(SAVEPOINT_ID_PATTERN, sp_id)
    assert check_id("latest", allow_latest=True) == "latest" and re.search(SAVEPOINT_REF_PATTERN, "latest")
    with pytest.raises(SavepointIdError) as e:
        check_id("latest")
    assert "latest" not in str(e.value).split(":", 1)[1]  # not offered where it is not accepted
    assert re.search(SAVEPOINT_ID_PATTERN, "latest") is None


def test_savepoint_uri_is_a_direct_child_of_the_root():
    assert savepoint_uri("file:///var/sp/app/", GOOD) == f"file:///var/sp/app/{GOOD}"
    assert savepoint_uri("s3://bucket/sp", GOOD) == f"s3://bucket/sp/{GOOD}"
    for bad in ("sp-x/../..", "../x", f"{GOOD}/..", ""):
        with pytest.raises(SavepointIdError):
            savepoint_uri("file:///var/sp/app", bad)


# ---------------------------------------------------------------------------- the library, on a local store
def _settings(tmp_path: Path, **kw) -> config.Settings:
    root = tmp_path / "savepoints"
    root.mkdir(exist_ok=True)
    return config.load(env={}, var_dir=tmp_path / "var", savepoint_uri=root.as_uri(), **kw)


def _savepoint(s: config.Settings, sp_id: str, manifest_id: str | None = None) -> Path:
    """A complete, intact savepoint at Spark batch 0 (no state), as `create` would leave it."""
    d = Path(s.savepoints.removeprefix("file://")) / sp_id
    files = {"metadata": b'{"id":"q"}', "offsets/0": b"v1\n{}\n{}", "commits/0": b"v1\n{}"}
    for rel, data in files.items():
        (d / DATA_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / DATA_DIR / rel).write_bytes(data)
    rt = savepoints.runtime(s)
    m = Manifest(
        id=manifest_id or sp_id,
        app=s.app_id,
        created_ms=savepoints.created_ms_of(sp_id),
        mode="running",
        checkpoint=s.checkpoint,
        spark_batch=0,
        ledger_batch=0,
        epoch=0,
        end_offsets=on_topic(s.source_topic, {0: 1}),
        watermark_ms=0,
        batch_ts_ms=0,
        group_offsets=on_topic(s.source_topic, {0: 1}),
        group_metadata=on_topic(s.source_topic, {0: ""}),
        ledger_entry={},
        spark_version=rt.spark_version,
        state_store_provider=rt.state_store_provider,
        shuffle_partitions=rt.shuffle_partitions,
        job_config_hash=rt.job_config_hash,
        files=tuple(FileEntry(r, len(b), savepoints._sha256(b)) for r, b in sorted(files.items())),
        total_size=sum(len(b) for b in files.values()),
    )
    (d / MANIFEST).write_text(m.to_json())
    return d


def test_delete_with_a_traversal_id_deletes_nothing(tmp_path):
    s = _settings(tmp_path)
    root = Path(s.savepoints.removeprefix("file://"))
    (root / "sp-x").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    good = _savepoint(s, GOOD)
    for bad in ("sp-x/../../outside", "sp-x/../..", "sp-x/..", f"{GOOD}/..", "../outside", str(outside), "sp-x"):
        with pytest.raises(SavepointIdError, match="invalid savepoint id"):
            savepoints.delete(s, bad)
    assert (outside / "precious").read_text() == "keep" and (root / "sp-x").is_dir() and good.is_dir()
    with pytest.raises(SavepointIdError):
        savepoints.delete(s, "latest")  # delete names one savepoint, never "whatever is newest"
    savepoints.delete(s, GOOD)
    assert not good.exists() and root.is_dir() and (outside / "precious").exists()
    with pytest.raises(SavepointError, match="no savepoint"):
        savepoints.delete(s, GOOD)


def test_verify_refuses_a_manifest_copied_from_another_savepoint(tmp_path):
    s = _settings(tmp_path)
    _savepoint(s, GOOD)
    assert savepoints.verify(s, GOOD).ok and savepoints.verify(s, "latest").id == GOOD
    # the same intact files, but the manifest names another savepoint: it was copied, or edited
    _savepoint(s, OTHER, manifest_id=GOOD)
    v = savepoints.verify(s, OTHER)
    assert v.id == OTHER and not v.ok and not v.compatible
    assert any(f"the manifest names savepoint {GOOD!r}" in p for p in v.problems), v.problems
    assert savepoints.last_verification(s, OTHER)["ok"] is False  # the verdict is kept beside OTHER
    assert savepoints.last_verification(s, GOOD)["ok"] is True  # ... and did not overwrite GOOD's
    # an id in the manifest that is no id at all is damage too, reported, not followed
    d = _savepoint(s, "sp-20261122T030000000Z-b9")
    mf = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps(mf | {"id": "../../outside"}))
    v = savepoints.verify(s, "sp-20261122T030000000Z-b9")
    assert not v.ok and any("'../../outside'" in p for p in v.problems)
    for bad in ("../x", "sp-x/../..", f"{GOOD}/..", "file:///etc"):
        with pytest.raises(SavepointIdError):
            savepoints.verify(s, bad)
        with pytest.raises(SavepointIdError):
            savepoints.load(s, bad)
        with pytest.raises(SavepointIdError):
            savepoints.last_verification(s, bad)


def test_list_shows_only_savepoint_directories(tmp_path):
    s = _settings(tmp_path)
    _savepoint(s, GOOD)
    root = Path(s.savepoints.removeprefix("file://"))
    (root / "sp-x").mkdir()  # not a name onceflow writes: not a savepoint, so never pruned either
    (root / "sp-20261122T040000000Z-b11").mkdir()  # incomplete (no manifest)
    got = {x.id: x.complete for x in savepoints.list_all(s)}
    assert got == {GOOD: True, "sp-20261122T040000000Z-b11": False}


def test_restore_refuses_a_bad_id_before_touching_anything(tmp_path, monkeypatch):
    s = _settings(tmp_path, bootstrap_servers="127.0.0.1:1")

    def touched(*a, **k):
        raise AssertionError("touched the job, the checkpoint or Kafka before checking the id")

    for name in ("status", "live_elsewhere"):
        monkeypatch.setattr(savepoints.jobctl, name, touched)
    monkeypatch.setattr(savepoints.ledger_writes, "app_writer", touched)
    monkeypatch.setattr(savepoints, "Store", touched)
    for bad in ("../x", "sp-x/../..", "/etc", "file:///etc"):
        for dry_run in (False, True):
            with pytest.raises(SavepointIdError, match="invalid savepoint id"):
                savepoints.restore(s, bad, dry_run=dry_run)
        with pytest.raises(SavepointIdError, match="invalid savepoint id"):
            savepoints.check_restore(s, bad)


# ---------------------------------------------------------------------------- the edges: DAG Params and the CLI
def _dag(name: str):
    """DAG `ip_count_<kind>` from its file; no metadata DB needed."""
    return dags.build(name.removeprefix("ip_count_"), "ip_count")


@pytest.mark.parametrize("name", ["ip_count_deploy", "ip_count_checkpoint_rotation"])
def test_dag_params_refuse_a_bad_savepoint_id_before_a_run_exists(name):
    p = _dag(name).params.get_param("savepoint_id")
    assert p.schema["pattern"] == SAVEPOINT_REF_PATTERN  # one definition, from the library
    assert p.resolve(GOOD) == GOOD and p.resolve("latest") == "latest"
    for bad in ("../x", "sp-x/../..", "/etc", "file:///etc", f"{GOOD}\n", ""):
        with pytest.raises(Exception, match="does not match|is too short|should be non-empty"):
            p.resolve(bad)
    if name == "ip_count_checkpoint_rotation":
        assert p.resolve(None) is None  # rotate runs need no id


@pytest.mark.parametrize("bad", ["../x", "sp-x/../..", "/etc", "file:///etc", "%2e%2e"])
def test_cli_refuses_a_bad_savepoint_id_with_exit_2(bad, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the command ran")

    monkeypatch.setattr(cli, "cmd_savepoint", never)
    for action in ("verify", "restore", "delete"):
        with pytest.raises(SystemExit) as e:
            cli.main(["savepoint", action, bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "invalid savepoint id" in err and "sp-<YYYYMMDD>T<HHMMSSmmm>Z-b<ledger batch>" in err
