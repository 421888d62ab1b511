"""Incremental tailing of progress logs: one path (``Tailer``), a log directory
(``DirectoryTailer``), or a whole finished file at once (``read_file``).

A line is read once its newline arrives. A path's file may appear late, be truncated or
rewritten in place (read again from byte 0), or be rotated away (the old file is read to
its end, and for as long as it keeps growing, before the new one is read from byte 0).

One poll reads at most ``ProgressConfig.max_poll_bytes`` of each file; the rest is read by
the next polls, so a huge log lags instead of stalling its reader. Only regular files are
read: a symlink, FIFO, device or socket where a log belongs is refused (``error``, counted
once in ``stats.refused``, logged), never followed, never waited on.

``prefetch`` does a poll's reading ahead, from a worker thread, and the next ``poll``
hands over its samples without touching a file: the agent reads logs off its event loop.

A tailer reads one metric (``choice``, ``specon.progress.metric``): when the rule picks one
other than the configured name, the tailer logs ``specon.progress.metric_chosen`` once.
"""

from __future__ import annotations

import abc
import fnmatch
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

import structlog

from specon.checkpoint import NotRegularFileError, file_kind
from specon.config import ProgressConfig
from specon.progress.detect import make_parser
from specon.progress.metric import MetricChoice
from specon.progress.parser import Decoder
from specon.progress.reader import READ_SIZE, FileReader, Identity, lstat, regular_identity
from specon.progress.samples import ProgressStats, Sample

log = structlog.get_logger()


class _Tailing(abc.ABC):
    """What both tailers share: config checks, stats, error reporting, read-ahead, closing."""

    def __init__(self, config: ProgressConfig, read_size: int, capped: bool, announce: bool = True) -> None:
        if config.format != "auto":
            make_parser(config.format, config)  # a bad format or regex fails here, not at first poll
        if config.max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be positive, got {config.max_line_bytes}")
        if config.max_poll_bytes < 1:
            raise ValueError(f"max_poll_bytes must be positive, got {config.max_poll_bytes}")
        self.config = config
        self.stats = ProgressStats()
        # The metric read, shared by every file and parser of this tailer.
        self.choice = MetricChoice(config.metric)
        self._announce = announce
        # The I/O error the last poll met (unreadable file, failing volume), or why the file
        # at the path is refused, for reporting; reading is tried again at the next poll.
        self.error: str | None = None
        self._read_size = read_size
        self._limit = config.max_poll_bytes if capped else None
        # Paths refused, with what was there: a refusal is counted and logged once per sighting.
        self._refused: dict[str, tuple[int, int] | None] = {}
        # ``prefetch`` runs in a worker thread while the loop may ``close``: the lock keeps a
        # file from being closed (and its descriptor number reused) under a read.
        self._lock = threading.Lock()
        self._closed = False
        self._ahead: list[Sample] | None = None

    def poll(self) -> list[Sample]:
        """The samples of the complete lines written since the previous poll (read by
        ``prefetch`` if one ran since: then no file is touched); nothing once closed."""
        with self._lock:
            out, self._ahead = self._ahead, None
            if self._closed:
                out = []
            elif out is None:
                out = self._poll()
        self._close_if_asked()
        self._announce_choice()
        return out

    def _announce_choice(self) -> None:
        if self._announce and self.choice.fallback:
            self._announce = False
            log.info(
                "specon.progress.metric_chosen",
                log=str(self),
                metric=self.choice.chosen,
                requested=self.choice.requested,
            )

    def prefetch(self) -> None:
        """Read ahead what the next ``poll`` returns; meant for a worker thread. A ``close``
        meanwhile does not wait for it: the files are closed as it returns."""
        with self._lock:
            if not self._closed:
                got = self._poll()
                self._ahead = got if self._ahead is None else self._ahead + got
        self._close_if_asked()

    @abc.abstractmethod
    def _poll(self) -> list[Sample]:
        """One poll's reading (under the lock)."""

    def _open(self, path: Path, previous: Decoder | None) -> FileReader | None:
        try:
            return FileReader.open(
                path,
                config=self.config,
                stats=self.stats,
                previous=previous,
                read_size=self._read_size,
                choice=self.choice,
            )
        except FileNotFoundError:
            return None
        except NotRegularFileError as exc:  # replaced since the path was looked at
            self._refuse(str(path), None, exc.kind)
            self.error = str(exc)
            return None
        except OSError as exc:
            self.error = f"{path}: {exc}"
            return None

    def _read(self, reader: FileReader, out: list[Sample], limit: int | None = None) -> int:
        limit = self._limit if limit is None else limit
        try:
            return reader.read(out, limit)
        except OSError as exc:
            self.error = f"reading {self}: {exc}"
            return 0

    def _skip_backlog(self, reader: FileReader, out: list[Sample]) -> None:
        """A file first met longer than one poll may read: read its head (the format, a CSV
        header), then go on from near its end. A backlog that long is history, not progress:
        the agent's first poll of a job only finds where its log ends (the job appends from
        now on), and Algorithm 1 wants a window of recent samples, which the tail holds."""
        if self._limit is None:
            return
        edge = min(READ_SIZE, self._limit)
        try:
            size = reader.size
            if size <= self._limit:
                return
            self._read(reader, out, edge)
            reader.skip_to(size - edge)
        except OSError as exc:
            self.error = f"reading {self}: {exc}"

    def _refuse(self, name: str, st: os.stat_result | None, kind: str | None = None) -> None:
        kind = kind or (file_kind(st.st_mode) if st is not None else "not a regular file")
        self.error = f"{name}: {kind}, not a regular file: not read"
        seen = None if st is None else (st.st_dev, st.st_ino)
        if name in self._refused and (seen is None or self._refused[name] == seen):
            return
        self._refused[name] = seen
        self.stats.refused += 1
        log.warning("specon.progress.file_refused", path=name, kind=kind)

    @abc.abstractmethod
    def _readers(self) -> list[FileReader]:
        """Every open reader, oldest file first."""

    def flush(self) -> list[Sample]:
        """Samples of unterminated last lines, parsed as final lines: for files that are finished."""
        out: list[Sample] = []
        with self._lock:
            for reader in self._readers():
                reader.flush(out)
        return out

    def close(self) -> None:
        """Close every file; polls return nothing from now on. Never waits for a ``prefetch``
        running in another thread: that one closes the files as it returns."""
        self._closed = True
        self._close_if_asked()

    def _close_if_asked(self) -> None:
        # Whoever finds the lock free closes: ``close`` if no read is under way, else the
        # reader when it is done (it checks ``_closed`` after releasing the lock).
        if self._closed and self._lock.acquire(blocking=False):
            try:
                for reader in self._readers():
                    reader.close()
            finally:
                self._lock.release()

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
        capped: bool = True,
        announce: bool = True,
    ) -> None:
        """``capped=False``: no ``max_poll_bytes`` limit (for reading a finished file whole);
        ``announce=False``: the metric rule's choice is not logged (the caller shows it)."""
        super().__init__(config or ProgressConfig(), read_size, capped, announce)
        self.path = Path(path)
        self.rotations = 0
        self._current: FileReader | None = None
        # The file rotated away, read on until a poll finds it idle.
        self._retired: FileReader | None = None
        self._last_parser: Decoder | None = None
        self._polled = False

    def __repr__(self) -> str:
        return f"Tailer({str(self.path)!r})"

    @property
    def offset(self) -> int:
        """Bytes read of the current file."""
        return 0 if self._current is None else self._current.offset

    @property
    def decoder(self) -> Decoder | None:
        """What reads the current file, once its format is known."""
        reader = self._current or self._retired
        return None if reader is None or reader.format is None else reader.parser

    def _poll(self) -> list[Sample]:
        self.error = None
        out: list[Sample] = []
        first, self._polled = not self._polled, True
        retired = self._retired
        if retired is not None and self._read(retired, out) == 0:
            self._close_retired()
        st = lstat(self.path)
        identity = regular_identity(st)
        if st is not None and identity is None:
            self._refuse(str(self.path), st)
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
            if first and self._current is not None:
                self._skip_backlog(self._current, out)
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
    Each poll reads at most ``max_poll_bytes`` of each file. ``backlog`` says where a file
    first met starts: ``"tail"`` (the default) reads a file longer than one poll's worth
    from its head (the format) and then its last bytes only, like ``Tailer``'s first poll:
    an agent restarted beside a long-running job classifies it from recent samples at
    once instead of spending many polls (and CPU) on its history, and a new job's log is
    short enough to be read whole anyway; ``"all"`` reads every file whole, over as many
    polls as it takes. Matching entries that are not regular files are refused;
    subdirectories are passed over.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        config: ProgressConfig | None = None,
        pattern: str = "*",
        *,
        read_size: int = READ_SIZE,
        backlog: Literal["tail", "all"] = "tail",
    ) -> None:
        super().__init__(config or ProgressConfig(), read_size, True)
        if backlog not in ("tail", "all"):
            raise ValueError(f"backlog must be 'tail' or 'all', got {backlog!r}")
        self.backlog = backlog
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

    def _poll(self) -> list[Sample]:
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
            active = self._active.get(identity) or self._open_new(identity, name, out)
            if active is not None:
                self._names[identity] = name
                self._read(active, out)
        return out

    def _open_new(self, identity: Identity, name: str, out: list[Sample]) -> FileReader | None:
        reader = self._open(self.directory / name, None)
        if reader is not None and reader.identity != identity:  # replaced since the scan: next poll
            reader.close()
            return None
        if reader is not None:
            self._active[identity] = reader
            if self.backlog == "tail":
                self._skip_backlog(reader, out)
        return reader

    def _scan(self) -> dict[Identity, str]:
        found: dict[Identity, str] = {}
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return found
        names = set()
        for entry in entries:
            if not fnmatch.fnmatchcase(entry.name, self.pattern):
                continue
            st = lstat(entry.path)
            identity = regular_identity(st)
            if identity is not None:
                found[identity] = entry.name
            elif st is not None and not stat.S_ISDIR(st.st_mode):
                self._refuse(entry.path, st)
                names.add(entry.path)
        for name in [n for n in self._refused if n not in names]:
            del self._refused[name]  # gone: a new one under that name is a new sighting
        return found

    def _readers(self) -> list[FileReader]:
        return [*self._retired.values(), *self._active.values()]


@dataclass(frozen=True, slots=True)
class LogRead:
    """A whole log read once: its samples, counters, format and metric."""

    samples: list[Sample]
    stats: ProgressStats
    format: str | None  # None: nothing in the file told (it is empty)
    choice: MetricChoice
    names: str  # what the format calls its names: "columns", "keys", "tags"...


def read_log(path: str | os.PathLike[str], config: ProgressConfig | None = None) -> LogRead:
    """Read a whole, finished log file once (its last line needs no newline).

    ``FileNotFoundError`` if it does not exist, ``NotRegularFileError`` (an ``OSError``) if it is
    not a regular file, ``UnreadableLogError`` (an ``OSError``) if it cannot be read here. A
    symlink is followed (this reads a file a user named); what it leads to must be a regular
    file.
    """
    target = Path(os.path.realpath(path))
    st = lstat(target)
    if st is None:
        raise FileNotFoundError(f"no progress log at {os.fspath(path)!r}")
    if regular_identity(st) is None:
        raise NotRegularFileError(path, file_kind(st.st_mode))
    with Tailer(target, config, capped=False, announce=False) as tailer:
        samples = tailer.poll()
        samples.extend(tailer.flush())
        if tailer.error is not None:
            raise OSError(tailer.error)
        decoder = tailer.decoder
        if decoder is None:
            return LogRead(samples, tailer.stats, None, tailer.choice, "names")
        return LogRead(samples, tailer.stats, decoder.format, tailer.choice, decoder.names)


def read_file(
    path: str | os.PathLike[str], config: ProgressConfig | None = None
) -> tuple[list[Sample], ProgressStats]:
    """``read_log``'s samples and counters."""
    got = read_log(path, config)
    return got.samples, got.stats
