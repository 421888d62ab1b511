"""One open log file read incrementally by byte offset: the engine under the tailers.

A ``FileReader`` owns one open file (one inode). With ``format: auto`` its first bytes say
whether it is read line by line or by a format's own framing (``detect.detect_kind``: a
TensorBoard event file, a ``trainer_state.json``); then a ``WholeFile`` reads it. Line by
line, it hands complete lines to its parser, keeps an unterminated last line until its
newline arrives, skips over-long lines without buffering them, and starts over when the
file is truncated or rewritten in place. Which file a path names (rotation, late files) is
the tailers' business.

Only regular files are read: the path is never followed through a symlink and a FIFO is
never waited on (``specon.checkpoint.open_regular``).
"""

from __future__ import annotations

import io
import os
import stat
import time

from specon.checkpoint import open_regular
from specon.config import ProgressConfig
from specon.progress.detect import SNIFF_BYTES, Kind, detect_format, detect_kind, make_parser
from specon.progress.metric import MetricChoice
from specon.progress.parser import Decoder, LineParser, WholeFile
from specon.progress.samples import ProgressStats, Sample, SkipReason
from specon.progress.trainer_state import TrainerStateFile

# Bytes per read: small enough to stay in cache, large enough to amortise per-read work.
READ_SIZE = 1 << 16
# The last bytes read are compared with the file on every read: if they changed, the file
# was rewritten in place even though it is no shorter than what was read.
WINDOW = 64

Identity = tuple[int, int]  # (st_dev, st_ino)


def lstat(path: str | os.PathLike[str]) -> os.stat_result | None:
    """What is at ``path`` itself (a symlink is not followed), or None if nothing is."""
    try:
        return os.lstat(path)
    except (OSError, ValueError):
        return None


def regular_identity(st: os.stat_result | None) -> Identity | None:
    """The (device, inode) of ``st`` if it is a regular file's."""
    return (st.st_dev, st.st_ino) if st is not None and stat.S_ISREG(st.st_mode) else None


class FileReader:
    """Reads one open file from byte 0 on, a poll at a time."""

    def __init__(
        self,
        file: io.FileIO,
        *,
        config: ProgressConfig,
        stats: ProgressStats,
        previous: Decoder | None = None,
        read_size: int = READ_SIZE,
        choice: MetricChoice | None = None,
    ) -> None:
        """``previous`` is the parser of the file this one replaces (rotation), if any;
        ``choice`` the log's metric choice (else the previous parser's, else a new one)."""
        st = os.fstat(file.fileno())
        self.identity: Identity = (st.st_dev, st.st_ino)
        self.offset = 0
        self.restarts = 0
        self._file = file
        self._config = config
        self._stats = stats
        self._read_size = read_size
        self._max_line = config.max_line_bytes
        self._pending = b""  # the unterminated last line
        self._discarding = False  # inside an over-long line (already counted), until its newline
        self._window = b""
        self._parser: LineParser | None = None  # None: format "auto", not yet detected
        self._whole: WholeFile | None = None  # a format read by its own framing
        self._previous = previous
        self.choice = choice or (previous.choice if previous else MetricChoice(config.metric))
        self._kind_known = config.format != "auto"
        if config.format != "auto":
            self._parser = (
                previous.restart(rewritten=False)
                if isinstance(previous, LineParser)
                else make_parser(config.format, config, self.choice)
            )

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        config: ProgressConfig,
        stats: ProgressStats,
        previous: Decoder | None = None,
        read_size: int = READ_SIZE,
        choice: MetricChoice | None = None,
    ) -> FileReader:
        """Open a regular file (``OSError`` if it is missing or unreadable, ``NotRegularFileError``
        if a symlink, FIFO, device, socket or directory is at the path)."""
        file = io.FileIO(open_regular(path), "r", closefd=True)
        try:
            return cls(
                file, config=config, stats=stats, previous=previous, read_size=read_size, choice=choice
            )
        except BaseException:
            file.close()
            raise

    @property
    def parser(self) -> Decoder | None:
        """The parser in use (or, before detection, the one of the file this replaced)."""
        return self._whole or self._parser or self._previous

    @property
    def format(self) -> str | None:
        """The format the file is read as, once known."""
        decoder = self._whole or self._parser
        return None if decoder is None else decoder.format

    @property
    def size(self) -> int:
        """The file's size now."""
        return os.fstat(self._file.fileno()).st_size

    def read(self, out: list[Sample], limit: int | None = None) -> int:
        """Append the samples of the complete lines added since the last read to ``out``.

        Returns the number of bytes read: at most ``limit``, the rest is left for the next
        read. Starts over from byte 0 first if the file was truncated or rewritten.
        """
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        if not self._kind_known and not self._sniff(fd, size, final=False):
            return 0
        if self._whole is not None:
            read = self._whole.read(fd, size, out, self._stats, limit)
            self.offset = self._whole.offset
            self._stats.bytes_read += read
            return read
        if size < self.offset or not self._window_unchanged(fd):
            self._restart()
        # Read up to the size seen on entry, so a fast writer cannot keep one poll going.
        start = self.offset
        end = size if limit is None else min(size, start + limit)
        while self.offset < end:
            data = os.pread(fd, min(self._read_size, end - self.offset), self.offset)
            if not data:
                break
            self.offset += len(data)
            self._stats.bytes_read += len(data)
            self._window = (self._window + data)[-WINDOW:]
            self._consume(data, out)
            # Let other threads have the GIL between chunks: read from a worker thread (the
            # agent's prefetch), parsing would otherwise hold it for a whole switch interval
            # at a time and keep the event loop waiting (a 200 MB read: /healthz p50 32 ms
            # without this, 1.5 ms with it). One cheap syscall per chunk.
            time.sleep(0)
        return self.offset - start

    def _window_unchanged(self, fd: int) -> bool:
        window = self._window
        return not window or os.pread(fd, len(window), self.offset - len(window)) == window

    def skip_to(self, offset: int) -> None:
        """Go on reading at ``offset`` (a backlog not worth reading): the line cut there is
        dropped up to its newline; the parser (format, CSV header) stays as it was."""
        if offset <= self.offset or self._whole is not None:
            return  # a whole-file format has no line to resume at
        self._pending = b""
        # The bytes before ``offset`` as if just read: a rewrite is still noticed.
        start = max(0, offset - WINDOW)
        self._window = os.pread(self._file.fileno(), offset - start, start)
        # Unless ``offset`` starts a line, the bytes up to the next newline are a fragment.
        self._discarding = not self._window.endswith(b"\n")
        self._stats.bytes_skipped += offset - self.offset
        self.offset = offset

    def flush(self, out: list[Sample]) -> None:
        """Parse the unterminated last line as a final line (the file is finished)."""
        fd = self._file.fileno()
        if not self._kind_known:
            self._sniff(fd, os.fstat(fd).st_size, final=True)
            self.read(out)
        if self._whole is not None:
            self._whole.flush(fd, out, self._stats)
            return
        if self._pending and not self._discarding:
            pending, self._pending = self._pending, b""
            self._emit(pending, out)

    def drop_partial(self) -> None:
        """Forget the unterminated last line (counted ``partial``): no newline will come."""
        if self._pending and not self._discarding:
            self._stats.skip(SkipReason.PARTIAL)
        self._pending = b""
        self._discarding = False

    def close(self) -> None:
        self._file.close()

    def _restart(self) -> None:
        self.drop_partial()
        self.offset = 0
        self.restarts += 1
        self._window = b""
        if self._config.format == "auto":
            self._previous = self.parser
            self._parser = None
            self._kind_known = False
        elif self._parser is not None:
            self._parser = self._parser.restart(rewritten=True)

    def _sniff(self, fd: int, size: int, *, final: bool) -> bool:
        """Decide from the first bytes how the file is read; False while they cannot tell."""
        head = os.pread(fd, min(size, SNIFF_BYTES), 0) if size else b""
        kind = detect_kind(head, final=final or size > SNIFF_BYTES)
        if kind is None:
            return False
        if kind != "lines":
            self._whole = self._make_whole(kind, fd)
        self._kind_known = True
        return True

    def _make_whole(self, kind: Kind, fd: int) -> WholeFile:
        if kind == "tensorboard":
            # Only here: the tensorboard package loads when an event file is met.
            from specon.progress.tfevents import EventFile  # noqa: PLC0415

            return EventFile(self._config, fd, choice=self.choice)
        previous = self._previous if isinstance(self._previous, TrainerStateFile) else None
        return TrainerStateFile(self._config, choice=self.choice, previous=previous)

    def _consume(self, data: bytes, out: list[Sample]) -> None:
        if self._discarding:
            newline = data.find(b"\n")
            if newline < 0:
                return
            self._discarding = False
            data = data[newline + 1 :]
        buf = self._pending + data if self._pending else data
        last = buf.rfind(b"\n")
        rest = buf[last + 1 :] if last >= 0 else buf
        if len(rest) > self._max_line:
            # Count it now; its bytes are dropped until its newline arrives.
            self._stats.skip(SkipReason.TOO_LONG)
            self._pending = b""
            self._discarding = True
        else:
            self._pending = rest
        if last >= 0:
            self._emit(buf[:last], out)

    def _emit(self, block: bytes, out: list[Sample]) -> None:
        parser = self._parser
        if parser is None:
            lines = block.split(b"\n")
            if not any(line.strip() for line in lines):
                self._stats.skip(SkipReason.BLANK, len(lines))
                return
            parser = self._parser = self._detect(lines)
        parser.parse_block(block, out, self._stats)

    def _detect(self, lines: list[bytes]) -> LineParser:
        fmt = detect_format(lines)
        previous = self._previous
        if not isinstance(previous, LineParser):
            return make_parser(fmt, self._config, self.choice)
        rewritten = self.restarts > 0  # else this file replaced another one
        if fmt == previous.format or previous.continues(lines):
            return previous.restart(rewritten=rewritten)
        return make_parser(fmt, self._config, self.choice)
