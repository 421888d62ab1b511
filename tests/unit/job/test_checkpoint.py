"""Checkpoint files: atomic write, verification, fallback past corrupt ones, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specon import checkpoint


def test_write_then_load_returns_payload_and_step(tmp_path: Path) -> None:
    info = checkpoint.write(tmp_path, 42, b"state")
    loaded = checkpoint.load(tmp_path)
    assert loaded is not None
    got, data = loaded
    assert (got.step, data) == (42, b"state")
    assert got.sha256 == info.sha256


def test_empty_or_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert checkpoint.latest_complete(tmp_path) is None
    assert checkpoint.load(tmp_path / "nope") is None


def test_corrupt_newest_falls_back_to_previous(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 10, b"ten")
    newest = checkpoint.write(tmp_path, 20, b"twenty")
    newest.payload.write_bytes(b"twentX")
    info = checkpoint.latest_complete(tmp_path)
    assert info is not None and info.step == 10
    errors = [i for i in checkpoint.iter_complete(tmp_path) if isinstance(i, checkpoint.CheckpointError)]
    assert len(errors) == 1 and "checksum" in str(errors[0])


@pytest.mark.parametrize(
    "damage",
    [
        lambda m, p: p.unlink(),
        lambda m, p: m.write_text("{not json"),
        lambda m, p: m.write_text(json.dumps({"format": 99, "step": 5, "size": 1, "sha256": "x"})),
        lambda m, p: p.write_bytes(b"short"),
    ],
    ids=["payload-missing", "manifest-garbage", "unknown-format", "truncated-payload"],
)
def test_damaged_checkpoint_is_never_complete(tmp_path: Path, damage: object) -> None:
    info = checkpoint.write(tmp_path, 5, b"payload-bytes")
    damage(info.manifest, info.payload)  # type: ignore[operator]
    assert checkpoint.latest_complete(tmp_path) is None
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.verify(info.manifest)


def test_payload_without_manifest_is_incomplete(tmp_path: Path) -> None:
    # A job killed between the payload rename and the manifest rename.
    (tmp_path / "ckpt-000000000007.bin").write_bytes(b"half")
    assert checkpoint.latest_complete(tmp_path) is None


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        checkpoint.write(tmp_path, step, str(step).encode(), keep=2)
    steps = [i.step for i in checkpoint.iter_complete(tmp_path) if isinstance(i, checkpoint.CheckpointInfo)]
    assert steps == [4, 3]
    assert not list(tmp_path.glob(".*tmp*"))


def test_negative_step_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        checkpoint.write(tmp_path, -1, b"")
