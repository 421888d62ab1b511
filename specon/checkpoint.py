"""Checkpoint files on the persistent volume: atomic write, verified read (SPEC §6).

A checkpoint is two files in the job's checkpoint directory:

* ``ckpt-<step>.bin``  - the payload (whatever the job serialised: a torch state dict, JSON, ...)
* ``ckpt-<step>.json`` - the manifest ``{"format": 1, "step", "size", "sha256", "created"}``

Both are written as temp file -> fsync -> rename, payload first, then the directory is
fsync'd. A checkpoint is *complete* only when its manifest exists and the payload's size
and SHA-256 match it, so a job killed mid-write, a torn file or bit rot is never restored
from: ``latest_complete`` falls back to the previous complete checkpoint instead.

The volume is shared with the jobs, and a job may plant anything in its directories. So
files are read only through ``open_regular`` (no symlink followed, no FIFO waited on, a
regular file or an error), payloads are hashed in chunks and never read past their
manifest's size, and temp files are created exclusively under random names. These file
primitives are also the ones the rest of specon reads and writes the volume with.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{12})\.json$")
# Payloads are hashed a chunk at a time: verifying a 400 MB checkpoint must not need 400 MB.
CHUNK = 1 << 20
# A manifest is a few hundred bytes; anything much larger is not one.
MANIFEST_MAX = 1 << 16
# Every read of a file on the shared volume: a symlink planted at the path is never
# followed (the agent runs as root), opening a FIFO never blocks, a terminal never becomes
# the controlling tty. What was opened is then checked to be a regular file (``open_regular``).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
APPEND_FLAGS = (
    os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
)


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or fails its checksum."""


class NotRegularFileError(OSError):
    """A symlink, FIFO, device, socket or directory stands where a regular file belongs."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(f"{os.fspath(path)}: {kind}, not a regular file: refused")
        self.path = os.fspath(path)
        self.kind = kind


class FileTooLargeError(OSError):
    """A volume file is longer than its reader allows: it is not read at all."""


def file_kind(mode: int) -> str:
    """What kind of file ``mode`` (an ``st_mode``) describes, for messages."""
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return kind
    return "a special file"


def open_regular(path: str | os.PathLike[str], flags: int = READ_FLAGS) -> int:
    """A read-only descriptor of the regular file at ``path`` (``flags=APPEND_FLAGS``: one
    to append to, created if missing).

    ``FileNotFoundError`` if nothing is there, ``NotRegularFileError`` for a symlink, FIFO,
    device, socket or directory (never a hang, never an endless read), other ``OSError``s
    as the system gives them. The caller closes the descriptor.
    """
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        # O_NOFOLLOW fails with ELOOP exactly when the last component is a symlink.
        if exc.errno == errno.ELOOP:
            raise NotRegularFileError(path, "a symlink") from exc
        raise
    try:
        mode = os.fstat(fd).st_mode
        # Checked on what was opened, not on a stat of the path: the path may change between.
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(path, file_kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole regular file at ``path``; ``FileTooLargeError`` if it holds more than ``limit`` bytes.

    At most ``limit + 1`` bytes are ever read, so a file that keeps growing cannot keep the
    reader going. Errors as ``open_regular``.
    """
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(CHUNK, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise FileTooLargeError(f"{os.fspath(path)}: larger than {limit} bytes: not read")
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    step: int
    payload: Path
    manifest: Path
    size: int
    sha256: str
    created: float


def _stem(step: int) -> str:
    return f"ckpt-{step:012d}"


def step_of(manifest_path: Path) -> int | None:
    """The step a manifest's name says (``ckpt-<step>.json``); None for any other name."""
    m = _NAME.match(manifest_path.name)
    return int(m.group(1)) if m else None


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Exclusive creation of a name nobody could predict: a symlink or file planted at a temp
# path (the volume is shared with the jobs) is never followed and never written through.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 100


def _create_temp(path: Path) -> tuple[Path, int]:
    for _ in range(_TEMP_TRIES):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            # 0o666 less the umask, as open() gives: readers running as other users still can.
            return tmp, os.open(tmp, _TEMP_FLAGS, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp name beside {path} after {_TEMP_TRIES} tries")


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` whole: temp file (exclusive, random name) -> fsync -> rename."""
    tmp, fd = _create_temp(path)
    try:
        with open(fd, "wb", closefd=True) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write(directory: Path, step: int, payload: bytes, *, keep: int = 2) -> CheckpointInfo:
    """Write a complete checkpoint for ``step`` and prune all but the newest ``keep``."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    directory.mkdir(parents=True, exist_ok=True)
    stem = _stem(step)
    payload_path = directory / f"{stem}.bin"
    manifest_path = directory / f"{stem}.json"
    digest = hashlib.sha256(payload).hexdigest()
    created = time.time()
    atomic_write(payload_path, payload)
    manifest = {"format": FORMAT, "step": step, "size": len(payload), "sha256": digest, "created": created}
    atomic_write(manifest_path, json.dumps(manifest).encode())
    fsync_dir(directory)
    info = CheckpointInfo(step, payload_path, manifest_path, len(payload), digest, created)
    prune(directory, keep=keep)
    return info


def _manifests(directory: Path) -> list[tuple[int, Path]]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), directory / n) for n in names if (m := _NAME.match(n))]
    return sorted(found, reverse=True)


def _read_manifest(manifest_path: Path) -> tuple[int, int, str, float]:
    """``(step, size, sha256, created)`` of one manifest; ``CheckpointError`` saying what is wrong."""
    try:
        meta = json.loads(read_regular(manifest_path, MANIFEST_MAX))
        step, size, digest = int(meta["step"]), int(meta["size"]), str(meta["sha256"])
        created = float(meta.get("created", 0.0))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{manifest_path}: manifest missing") from exc
    except (NotRegularFileError, FileTooLargeError) as exc:  # a symlink, FIFO or device; too large
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{manifest_path}: unknown checkpoint format {meta.get('format')!r}")
    if size < 0:
        raise CheckpointError(f"{manifest_path}: negative size {size}")
    return step, size, digest, created


def _check_payload(payload_path: Path, size: int, digest: str, keep: list[bytes] | None = None) -> None:
    """Hash the payload a chunk at a time against the manifest's ``size`` and ``digest``.

    Reads at most ``size + 1`` bytes: a payload longer than its manifest says (or growing
    while it is read) fails without being read to its end. ``keep`` collects the bytes
    read, for ``read_payload``.
    """
    try:
        fd = open_regular(payload_path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{payload_path}: payload missing") from exc
    except NotRegularFileError as exc:
        raise CheckpointError(f"{payload_path}: unreadable payload ({exc})") from exc
    try:
        on_disk = os.fstat(fd).st_size
        if on_disk != size:  # cheap, before reading a byte
            raise CheckpointError(f"{payload_path}: size {on_disk} != manifest {size}")
        sha = hashlib.sha256()
        buf = bytearray(min(CHUNK, size + 1))
        view = memoryview(buf)
        got = 0
        while got <= size:
            n = os.readv(fd, [view[: min(len(buf), size + 1 - got)]])
            if n == 0:
                break
            sha.update(view[:n])
            if keep is not None:
                keep.append(bytes(view[:n]))
            got += n
    finally:
        os.close(fd)
    if got != size:
        raise CheckpointError(f"{payload_path}: size changed while being read (manifest {size})")
    if sha.hexdigest() != digest:
        raise CheckpointError(f"{payload_path}: checksum mismatch")


def verify(manifest_path: Path) -> CheckpointInfo:
    """Check one checkpoint; raise ``CheckpointError`` saying what is wrong.

    Memory stays at one chunk whatever the payload's size; a symlink, FIFO or device in
    place of the manifest or the payload is an error, never a hang or an endless read.
    """
    step, size, digest, created = _read_manifest(manifest_path)
    payload_path = manifest_path.with_suffix(".bin")
    _check_payload(payload_path, size, digest)
    return CheckpointInfo(step, payload_path, manifest_path, size, digest, created)


def read_payload(info: CheckpointInfo) -> bytes:
    """The payload of a checkpoint, checked again as it is read (it may have changed since
    ``verify``); ``CheckpointError`` if it no longer matches its manifest."""
    chunks: list[bytes] = []
    _check_payload(info.payload, info.size, info.sha256, keep=chunks)
    return b"".join(chunks)


def iter_complete(directory: Path) -> Iterator[CheckpointInfo | CheckpointError]:
    """Newest first: each checkpoint, verified, or the error that disqualifies it."""
    for _step, manifest in _manifests(directory):
        try:
            yield verify(manifest)
        except CheckpointError as exc:
            yield exc


def latest_complete(directory: Path) -> CheckpointInfo | None:
    """The newest checkpoint that verifies, or None. Corrupt ones are skipped."""
    for item in iter_complete(directory):
        if isinstance(item, CheckpointInfo):
            return item
    return None


def load(directory: Path) -> tuple[CheckpointInfo, bytes] | None:
    """The newest complete checkpoint and its payload, or None when there is none."""
    for _step, manifest in _manifests(directory):
        try:
            step, size, digest, created = _read_manifest(manifest)
            info = CheckpointInfo(step, manifest.with_suffix(".bin"), manifest, size, digest, created)
            # Read and checked in one pass: what is returned is what was hashed.
            return info, read_payload(info)
        except CheckpointError:
            continue
    return None


def prune(directory: Path, *, keep: int = 2) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (and stale temp files)."""
    complete = [i for i in iter_complete(directory) if isinstance(i, CheckpointInfo)]
    for info in complete[keep:]:
        for path in (info.manifest, info.payload):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def key(info: CheckpointInfo | None) -> tuple[int, float] | None:
    """What makes one checkpoint newer than another (step, then write time)."""
    return None if info is None else (info.step, info.created)


def never_written(directory: Path) -> bool:
    """No checkpoint manifest at all, complete or not: the job never checkpointed."""
    return next(iter_complete(directory), None) is None


def stand_in(named: Path) -> Path | None:
    """The newest complete checkpoint beside ``named`` (its manifest) if ``named`` fails
    verification: what a restore falls back to when a checkpoint rotted after the save. None
    if ``named`` verifies (a start failed for another reason) or nothing beside it does."""
    try:
        verify(named.with_suffix(".json"))
    except CheckpointError:
        info = latest_complete(named.parent)
        return None if info is None else info.manifest
    return None
