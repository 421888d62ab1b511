"""Checkpoints on a volume the jobs share: payloads hashed in chunks against the manifest's
size, symlinks and FIFOs refused, temp files created exclusively under random names."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest

from specon import checkpoint


@pytest.mark.slow
def test_verification_memory_stays_at_a_chunk_for_a_large_payload(tmp_path: Path) -> None:
    payload = bytes(range(256)) * (64 << 12)  # 64 MiB
    info = checkpoint.write(tmp_path, 1, payload)
    del payload

    tracemalloc.start()
    try:
        assert checkpoint.verify(info.manifest) == info
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 4 * checkpoint.CHUNK, f"verification peaked at {peak / 2**20:.1f} MiB"


def test_a_payload_symlinked_to_dev_zero_fails_at_once(tmp_path: Path) -> None:
    # In a child with bounded memory: reading /dev/zero whole must not take this test run down.
    info = checkpoint.write(tmp_path, 1, b"state")
    info.payload.unlink()
    info.payload.symlink_to("/dev/zero")
    code = (
        "import resource, sys; from pathlib import Path; from specon import checkpoint\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "try: checkpoint.verify(Path(sys.argv[1]))\n"
        "except checkpoint.CheckpointError as e: print(e); raise SystemExit(0)\n"
        "raise SystemExit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(info.manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "symlink" in proc.stdout


def test_a_symlinked_payload_or_manifest_is_refused_even_to_a_good_copy(tmp_path: Path) -> None:
    info = checkpoint.write(tmp_path / "ck", 1, b"state")
    for path in (info.payload, info.manifest):
        copy = tmp_path / path.name
        copy.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(copy)

        with pytest.raises(checkpoint.CheckpointError, match="symlink"):
            checkpoint.verify(info.manifest)
        assert checkpoint.load(info.manifest.parent) is None
        path.unlink()
        path.write_bytes(copy.read_bytes())
    assert checkpoint.verify(info.manifest) == info


@pytest.mark.parametrize("which", ["payload", "manifest"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_an_error_not_a_hang(tmp_path: Path, which: str) -> None:
    info = checkpoint.write(tmp_path, 1, b"state")
    path = info.payload if which == "payload" else info.manifest
    path.unlink()
    os.mkfifo(path)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            checkpoint.verify(info.manifest)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(5.0)
    hung = thread.is_alive()
    if hung:  # release the reader stuck in open() before failing
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert not hung
    [error] = errors
    assert isinstance(error, checkpoint.CheckpointError) and "FIFO" in str(error)


def test_a_payload_longer_than_its_manifest_says_fails_without_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = checkpoint.write(tmp_path, 1, b"state")
    with info.payload.open("ab") as fh:
        fh.truncate(1 << 30)  # sparse: a gigabyte the manifest does not know about
    reads: list[int] = []
    readv = os.readv

    def counting(fd: int, buffers: list[memoryview]) -> int:
        n = readv(fd, buffers)
        reads.append(n)
        return n

    monkeypatch.setattr(os, "readv", counting)

    with pytest.raises(checkpoint.CheckpointError, match="size"):
        checkpoint.verify(info.manifest)
    assert sum(reads) == 0  # the size alone gave it away


def test_a_payload_that_grows_while_hashed_is_read_to_size_plus_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = checkpoint.write(tmp_path, 1, b"x" * 10)
    reads: list[int] = []
    readv = os.readv

    def growing(fd: int, buffers: list[memoryview]) -> int:
        if not reads:
            with info.payload.open("ab") as fh:  # the job writes on after the size check
                fh.write(b"y" * (5 << 20))
        n = readv(fd, buffers)
        reads.append(n)
        return n

    monkeypatch.setattr(os, "readv", growing)

    with pytest.raises(checkpoint.CheckpointError, match="size changed"):
        checkpoint.verify(info.manifest)
    assert sum(reads) == 11


def test_load_returns_what_it_hashed(tmp_path: Path) -> None:
    checkpoint.write(tmp_path, 1, b"one")
    newest = checkpoint.write(tmp_path, 2, b"two")
    assert checkpoint.read_payload(newest) == b"two"
    newest.payload.write_bytes(b"twX")

    loaded = checkpoint.load(tmp_path)

    assert loaded is not None and (loaded[0].step, loaded[1]) == (1, b"one")
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.read_payload(newest)


# --- atomic_write -----------------------------------------------------------------------------


def test_atomic_write_never_follows_a_symlink_planted_at_the_old_temp_path(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "owner.json"
    (tmp_path / f".{target.name}.tmp{os.getpid()}").symlink_to(victim)  # the predictable name of old

    checkpoint.atomic_write(target, b"new")

    assert victim.read_bytes() == b"precious"
    assert target.read_bytes() == b"new" and not target.is_symlink()


def test_atomic_write_goes_around_anything_at_its_random_temp_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    target = tmp_path / "state.json"
    names = iter(["planted", "fresh"])
    monkeypatch.setattr("specon.checkpoint.secrets.token_hex", lambda _n: next(names))
    planted = tmp_path / f".{target.name}.planted.tmp"
    planted.symlink_to(victim)

    checkpoint.atomic_write(target, b"new")

    assert victim.read_bytes() == b"precious" and planted.is_symlink()
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["victim", "state.json", planted.name])


def test_atomic_write_leaves_no_temp_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(_fd: int) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="disk gone"):
        checkpoint.atomic_write(tmp_path / "x.json", b"data")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_usual_file_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        checkpoint.atomic_write(tmp_path / "spec.json", b"{}")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "spec.json").stat().st_mode) == 0o644
