"""Incremental tailing of progress logs: one path (``Tailer``), a log directory
(``DirectoryTailer``), or a whole finished file at once (``read_file``).

A line is read once its newline arrives. A path's file may appear late, be truncated or
rewritten in place (read again from byte 0), or be rotated away (the old file is read to
its end, and for as long as it keeps growing, before the new one is read from byte 0).
"""

from __future__ import annotations

import abc
import fnmatch
import os
from pathlib import Path
from types import TracebackType
from typing import Self

from specon.config import ProgressConfig
from specon.progress.detect import make_parser
from specon.progress.parser import LineParser
from specon.progress.reader import READ_SIZE, FileReader, Identity, regular_file_identity
from specon.progress.samples import ProgressStats, Sample


class _Tailing(abc.ABC):
    """What both tailers share: config checks, stats, error reporting, closing."""

    def __init__(self, config: ProgressConfig, read_size: int) -> None:
        if config.format != "auto":
            make_parser(config.format, config)  # a bad format or regex fails here, not at first poll
        if config.max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, got {config.max_line_bytes}")
        self.config = config
        self.stats = ProgressStats()
        # The I/O error the last poll met (unreadable file, failing volume), for reporting;
        # reading is tried again at the next poll.
        self.error: str | None = None
        self._read_size = read_size

    def _open(self, path: Path, previous: LineParser | None) -> FileReader | None:
        try:
            return FileReader.open(
                path, config=self.config, stats=self.stats, previous=previous, read_size=self._read_size
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.error = f"{path}: {exc}"
            return None

    def _read(self, reader: FileReader, out: list[Sample]) -> int:
        try:
            return reader.read(out)
        except OSError as exc:
            self.error = f"reading {self}: {exc}"
            return 0

    @abc.abstractmethod
    def _readers(self) -> list[FileReader]:
        """Every open reader, oldest file first."""

    def flush(self) -> list[Sample]:
        """Samples of unterminated last lines, parsed as final lines: for files that are finished."""
        out: list[Sample] = []
        for reader in self._readers():
            reader.flush(out)
        return out

    def close(self) -> None:
        for reader in self._readers():
            reader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Tailer(_Tailing):
    """Tails the log file at one path.

    ``poll()`` returns the samples of the complete lines written since the previous poll
    (old file first after a rotation). ``stats`` counts lines, samples and skips.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: ProgressConfig | None = None,
        *,
        read_size: int = READ_SIZE,
    ) -> None:
        super().__init__(config or ProgressConfig(), read_size)
        self.path = Path(path)
        self.rotations = 0
        self._current: FileReader | None = None
        # The file rotated away, read on until a poll finds it idle.
        self._retired: FileReader | None = None
        self._last_parser: LineParser | None = None

    def __repr__(self) -> str:
        return f"Tailer({str(self.path)!r})"

    @property
    def offset(self) -> int:
        """Bytes read of the current file."""
        return 0 if self._current is None else self._current.offset

    def poll(self) -> list[Sample]:
        self.error = None
        out: list[Sample] = []
        retired = self._retired
        if retired is not None and self._read(retired, out) == 0:
            self._close_retired()
        identity = regular_file_identity(self.path)
        current = self._current
        if current is not None and current.identity != identity:
            # Rotated, replaced or deleted: take what was appended before the switch.
            self._read(current, out)
            self._close_retired()
            self._retired, self._current = current, None
            self._last_parser = current.parser
            self.rotations += 1
        if self._current is None and identity is not None:
            self._current = self._open(self.path, self._last_parser)
        if self._current is not None:
            self._read(self._current, out)
        return out

    def _close_retired(self) -> None:
        if self._retired is not None:
            self._retired.drop_partial()
            self._retired.close()
            self._retired = None

    def _readers(self) -> list[FileReader]:
        return [r for r in (self._retired, self._current) if r is not None]


class DirectoryTailer(_Tailing):
    """Tails every regular file in ``directory`` whose name matches ``pattern``, including
    files that appear later, and merges their samples (files in name order).

    Files are followed by identity (device, inode), not by name: a file renamed within
    the directory (``log`` -> ``log.1``) is not read again, it is read on from where it was.
    A file that leaves the directory (or no longer matches) is read until idle, then closed.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: ProgressConfig | None = None,
        pattern: str = "*",
        *,
        read_size: int = READ_SIZE,
    ) -> None:
        super().__init__(config or ProgressConfig(), read_size)
        self.directory = Path(directory)
        self.pattern = pattern
        self._active: dict[Identity, FileReader] = {}
        self._names: dict[Identity, str] = {}
        self._retired: dict[Identity, FileReader] = {}

    def __repr__(self) -> str:
        return f"DirectoryTailer({str(self.directory)!r}, pattern={self.pattern!r})"

    @property
    def files(self) -> list[Path]:
        """The files being tailed, by their current names."""
        return [self.directory / name for name in sorted(self._names.values())]

    def poll(self) -> list[Sample]:
        self.error = None
        out: list[Sample] = []
        present = self._scan()
        for identity in list(self._retired):
            reader = self._retired[identity]
            if identity in present:  # came back (renamed back into the pattern)
                self._active[identity] = self._retired.pop(identity)
            elif self._read(reader, out) == 0:
                reader.drop_partial()
                reader.close()
                del self._retired[identity]
        for identity in [i for i in self._active if i not in present]:
            reader = self._active.pop(identity)
            del self._names[identity]
            self._read(reader, out)
            self._retired[identity] = reader
        for identity, name in sorted(present.items(), key=lambda item: item[1]):
            active = self._active.get(identity) or self._open_new(identity, name)
            if active is not None:
                self._names[identity] = name
                self._read(active, out)
        return out

    def _open_new(self, identity: Identity, name: str) -> FileReader | None:
        reader = self._open(self.directory / name, None)
        if reader is not None and reader.identity != identity:  # replaced since the scan: next poll
            reader.close()
            return None
        if reader is not None:
            self._active[identity] = reader
        return reader

    def _scan(self) -> dict[Identity, str]:
        found: dict[Identity, str] = {}
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return found
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, self.pattern):
                continue
            identity = regular_file_identity(entry.path)
            if identity is not None:
                found[identity] = entry.name
        return found

    def _readers(self) -> list[FileReader]:
        return [*self._retired.values(), *self._active.values()]


def read_file(
    path: str | os.PathLike[str], config: ProgressConfig | None = None
) -> tuple[list[Sample], ProgressStats]:
    """Read a whole, finished log file once (its last line needs no newline).

    ``FileNotFoundError`` if it does not exist.
    """
    if regular_file_identity(path) is None:
        raise FileNotFoundError(f"no progress log at {os.fspath(path)!r}")
    with Tailer(path, config) as tailer:
        samples = tailer.poll()
        samples.extend(tailer.flush())
        if tailer.error is not None:
            raise OSError(tailer.error)
        return samples, tailer.stats
