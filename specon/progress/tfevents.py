"""TensorBoard event files (``events.out.tfevents.*``): their scalars, read with the
``tensorboard`` package (the ``tensorboard`` extra: ``pip install 'specon[tensorboard]'``).
This is the only module that imports it (an import-linter contract), and it is imported only
when an event file is met.

TensorBoard's own loader (``event_file_loader.RawEventFileLoader``) reads the records (the
TFRecord framing and its checksums) and its compat layers (``data_compat``,
``dataclass_compat``) say which values are scalars, as TensorBoard itself shows them, from
TF 1 and TF 2 writers, PyTorch's ``SummaryWriter`` (Lightning's ``TensorBoardLogger``, the
Trainer's ``report_to="tensorboard"``) and tensorboardX. The loader is handed
``/proc/self/fd/N`` of the file the reader opened (``specon.checkpoint.open_regular``), so it
reads that file, never a symlink or FIFO put at the path since.

Each event record counts as one line: a sample when it carries the metric's tag as a scalar
(value, ``step``, ``wall_time`` as its time), else ``no_metric``; the file-version record is
a header. A record whose length field claims more than ``MAX_RECORD_BYTES`` stops the file
(``too_long``): nothing is allocated for it. An event file is append-only and read from its
start (a record boundary cannot be found from the middle), at most ``max_poll_bytes`` a
poll: unlike a long text log, whose first poll jumps to its end, an event file met long
is read through its history over the first polls. A record still being written waits for
the next poll, and one cut short at the end of a finished file counts as ``partial``.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator
from typing import Any, ClassVar

from specon.config import ProgressConfig
from specon.progress.metric import MetricChoice
from specon.progress.parser import LogFormat, WholeFile
from specon.progress.samples import ProgressStats, Sample, SkipReason, UnreadableLogError

try:
    from google.protobuf.message import DecodeError  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from tensorboard import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        data_compat,
        dataclass_compat,
    )
    from tensorboard.backend.event_processing import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        event_file_loader,
    )
    from tensorboard.compat.proto import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        event_pb2,
        summary_pb2,
    )
    from tensorboard.util import tensor_util  # type: ignore[import-untyped,import-not-found,unused-ignore]
except ImportError as exc:  # the extra is not installed: said when an event file is met
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

EXTRA_HINT = "pip install 'specon[tensorboard]'"
# A record's length (8 bytes), its checksum (4), then the data and its checksum (4).
_HEADER = 12
_FRAMING = 16
# Far above any scalar event; image summaries of a few MB pass too.
MAX_RECORD_BYTES = 64 << 20


def missing_extra() -> str | None:
    """Why event files cannot be read here (the extra is missing), or None."""
    if _MISSING is None:
        return None
    return f"a TensorBoard event file: reading it needs the tensorboard extra ({EXTRA_HINT}): {_MISSING}"


def _fd_path(fd: int) -> str:
    """A path that opens the file behind ``fd`` itself (Linux: ``/proc/self/fd/N``)."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


class EventFile(WholeFile):
    format: ClassVar[LogFormat] = "tensorboard"
    names: ClassVar[str] = "tags"

    def __init__(self, config: ProgressConfig, fd: int, *, choice: MetricChoice | None = None) -> None:
        """Read the event file open at ``fd`` (``UnreadableLogError`` without the extra)."""
        reason = missing_extra()
        if reason is not None:
            raise UnreadableLogError(reason)
        super().__init__(config, choice=choice)
        self._path = _fd_path(fd)
        self._start()
        self._stopped = False  # a record claimed too much: the rest of the file is not read

    def _start(self) -> None:
        self._loader: Any = event_file_loader.RawEventFileLoader(self._path)
        self._records: Iterator[bytes] | None = None
        self._metadata: dict[str, Any] = {}  # first metadata per tag (``dataclass_compat``)
        self.offset = 0

    def read(self, fd: int, size: int, out: list[Sample], stats: ProgressStats, limit: int | None) -> int:
        if size < self.offset:  # truncated: an event file starting over
            self._start()
            self._stopped = False
        start = self.offset
        while not self._stopped and size - self.offset >= _HEADER:
            if limit is not None and self.offset - start >= limit:
                break
            (claimed,) = struct.unpack("<Q", os.pread(fd, 8, self.offset))
            if claimed > MAX_RECORD_BYTES:
                self._stopped = True
                stats.skip(SkipReason.TOO_LONG)
                break
            raw = self._next()
            if raw is None:  # not complete yet (or not a valid record)
                break
            self.offset += len(raw) + _FRAMING
            self._decode(raw, out, stats)
        return self.offset - start

    def _next(self) -> bytes | None:
        # One generator for as long as it yields: a new ``Load()`` after it ran dry resumes
        # at the record it stopped before (the loader keeps the offset).
        if self._records is None:
            self._records = iter(self._loader.Load())
        raw: bytes | None = next(self._records, None)
        if raw is None:
            self._records = None
        return raw

    def flush(self, fd: int, out: list[Sample], stats: ProgressStats) -> None:
        del out
        if not self._stopped and os.fstat(fd).st_size > self.offset:
            stats.skip(SkipReason.PARTIAL)  # a record cut short, or one whose checksum fails

    def _decode(self, raw: bytes, out: list[Sample], stats: ProgressStats) -> None:
        try:
            event = event_pb2.Event.FromString(raw)
        except DecodeError:
            stats.skip(SkipReason.UNPARSABLE)
            return
        if event.HasField("file_version"):
            stats.skip(SkipReason.HEADER)
            return
        scalars: dict[str, float | SkipReason] = {}
        for migrated in dataclass_compat.migrate_event(data_compat.migrate_event(event), self._metadata):
            for value in migrated.summary.value:
                if value.metadata.data_class == summary_pb2.DATA_CLASS_SCALAR:
                    scalars.setdefault(value.tag, _scalar(value.tensor))
        metric = self.choice.offer(scalars) if scalars else None
        result = scalars.get(metric, SkipReason.NO_METRIC) if metric is not None else SkipReason.NO_METRIC
        if isinstance(result, SkipReason):
            stats.skip(result)
            return
        stats.lines += 1
        stats.samples += 1
        out.append(Sample(result, event.wall_time or None, event.step))


def _scalar(tensor: Any) -> float | SkipReason:
    try:
        array = tensor_util.make_ndarray(tensor)
        if array.size != 1 or array.dtype.kind not in "fiub":
            return SkipReason.UNPARSABLE
        value = float(array.reshape(()).item())
    except (ValueError, TypeError, OverflowError):
        return SkipReason.UNPARSABLE
    return value if math.isfinite(value) else SkipReason.NONFINITE
