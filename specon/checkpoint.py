"""Checkpoint files on the persistent volume: atomic write, verified read (SPEC §6).

A checkpoint is two files in the job's checkpoint directory:

* ``ckpt-<step>.bin``  - the payload (whatever the job serialised: a torch state dict, JSON, ...)
* ``ckpt-<step>.json`` - the manifest ``{"format": 1, "step", "size", "sha256", "created"}``

Both are written as temp file -> fsync -> rename, payload first, then the directory is
fsync'd. A checkpoint is *complete* only when its manifest exists and the payload's size
and SHA-256 match it, so a job killed mid-write, a torn file or bit rot is never restored
from: ``latest_complete`` falls back to the previous complete checkpoint instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{12})\.json$")


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete or fails its checksum."""


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


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def verify(manifest_path: Path) -> CheckpointInfo:
    """Check one checkpoint; raise ``CheckpointError`` saying what is wrong."""
    try:
        meta = json.loads(manifest_path.read_bytes())
        step, size, digest = int(meta["step"]), int(meta["size"]), str(meta["sha256"])
        created = float(meta.get("created", 0.0))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{manifest_path}: manifest missing") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from exc
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{manifest_path}: unknown checkpoint format {meta.get('format')!r}")
    payload_path = manifest_path.with_suffix(".bin")
    try:
        data = payload_path.read_bytes()
    except FileNotFoundError as exc:
        raise CheckpointError(f"{payload_path}: payload missing") from exc
    if len(data) != size:
        raise CheckpointError(f"{payload_path}: size {len(data)} != manifest {size}")
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(f"{payload_path}: checksum mismatch")
    return CheckpointInfo(step, payload_path, manifest_path, size, digest, created)


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
    info = latest_complete(directory)
    if info is None:
        return None
    return info, info.payload.read_bytes()


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
