"""A file's lifetime: from its birth (creation) to its last modification, where the system
tells (``specon classify`` spreads records without timestamps over it: ``spacing``).

Linux's ``statx`` reports the birth time on most filesystems (ext4, xfs, btrfs...);
Python 3.11's ``os.stat`` does not expose it, so ``statx`` is called through the C library
(glibc 2.28 or later). Elsewhere, or where the filesystem keeps no birth time, the lifetime
is unknown (None).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_STATX_BTIME = 0x800
# struct statx (linux/stat.h): stx_mask at 0, stx_btime {tv_sec: s64, tv_nsec: u32} at 80,
# 256 bytes in all.
_STATX_SIZE = 256
_BTIME_OFFSET = 80


@cache
def _statx() -> Callable[..., int] | None:
    try:
        fn: Any = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


def birth_time(path: str | os.PathLike[str]) -> float | None:
    """When the file at ``path`` (not followed if a symlink) was created, in epoch seconds."""
    statx = _statx()
    if statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buf) != 0:
        return None
    (mask,) = struct.unpack_from("=I", buf, 0)
    if not mask & _STATX_BTIME:
        return None
    seconds, nanoseconds = struct.unpack_from("=qI", buf, _BTIME_OFFSET)
    return float(seconds) + float(nanoseconds) / 1e9


def lifetime(path: str | os.PathLike[str]) -> float | None:
    """Seconds from the file's birth to its last modification; None if unknown."""
    born = birth_time(path)
    if born is None:
        return None
    try:
        modified = os.lstat(path).st_mtime
    except OSError:
        return None
    return modified - born
