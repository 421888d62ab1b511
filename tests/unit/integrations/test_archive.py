"""The checkpoint payload: a framework's files packed with specon.json; RNG states as JSON."""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import pytest

from specon import checkpoint
from specon.integrations import archive
from specon.integrations.archive import PayloadError, extract_newest, pack, unpack


def test_files_and_folders_round_trip(tmp_path: Path) -> None:
    (tmp_path / "model.ckpt").write_bytes(b"\x00weights")
    folder = tmp_path / "checkpoint-7"
    (folder / "sub").mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    (folder / "sub" / "optimizer.pt").write_bytes(b"opt")
    data = pack("lightning", 7, {"model.ckpt": tmp_path / "model.ckpt", "checkpoint-7": folder}, epoch=2)
    meta = unpack(data, tmp_path / "out", "lightning")
    assert meta == {"format": archive.FORMAT, "framework": "lightning", "step": 7, "epoch": 2}
    assert (tmp_path / "out" / "model.ckpt").read_bytes() == b"\x00weights"
    assert (tmp_path / "out" / "checkpoint-7" / "sub" / "optimizer.pt").read_bytes() == b"opt"


def test_another_frameworks_checkpoint_is_refused(tmp_path: Path) -> None:
    data = pack("keras", 3, {})
    with pytest.raises(PayloadError, match="'keras' integration's, not 'lightning'"):
        unpack(data, tmp_path, "lightning")


@pytest.mark.parametrize("data", [b"", b"not a tar at all" * 100, b"\x00" * 2048])
def test_garbage_is_refused(tmp_path: Path, data: bytes) -> None:
    with pytest.raises(PayloadError):
        unpack(data, tmp_path, "keras")


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_a_jobkit_payload_is_not_taken_for_one(tmp_path: Path) -> None:
    with pytest.raises(PayloadError, match=r"not a specon\.integrations checkpoint"):
        unpack(_tar({"model.ckpt": b"x"}), tmp_path, "keras")


def test_nothing_is_written_outside_the_destination(tmp_path: Path) -> None:
    meta = json.dumps({"format": archive.FORMAT, "framework": "keras", "step": 1}).encode()
    evil = _tar({archive.META: meta, "../escaped": b"x"})
    with pytest.raises(PayloadError):
        unpack(evil, tmp_path / "dest", "keras")
    assert not (tmp_path / "escaped").exists()


def test_extract_newest_takes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "w").write_bytes(b"one")
    checkpoint.write(tmp_path / "ckpt", 4, pack("keras", 4, {"w": tmp_path / "w"}))
    (tmp_path / "w").write_bytes(b"two")
    checkpoint.write(tmp_path / "ckpt", 8, pack("keras", 8, {"w": tmp_path / "w"}))
    found = extract_newest("keras", tmp_path / "ckpt")
    assert found is not None
    folder, meta = found
    assert meta["step"] == 8 and (folder / "w").read_bytes() == b"two"
    assert extract_newest("keras", tmp_path / "empty") is None


def test_rng_states_round_trip_as_json() -> None:
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    state = json.loads(json.dumps(archive.rng_state()))  # plain JSON, as stored in a payload
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    # Every generator moves on, then is put back.
    random.random(), np.random.rand(), torch.rand(5)
    archive.set_rng_state(state)
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert expected[:2] == again[:2] and torch.equal(expected[2], again[2])
