"""What reading a progress log yields: samples, typed skips, their counters, and the error
of a log that cannot be read at all."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Sample:
    """One finite metric value read from a log line.

    ``value`` is raw: direction (minimise / maximise) is the classifier's business.
    ``ts`` is epoch seconds when the record carries a timestamp, ``step`` the record's
    step (or epoch / iteration) when it carries one.
    """

    value: float
    ts: float | None = None
    step: int | None = None


class SkipReason(enum.StrEnum):
    """Why a line produced no sample. Every counted line is a sample or exactly one of these."""

    NONFINITE = "nonfinite"  # the metric is NaN or ±inf
    UNPARSABLE = "unparsable"  # not a record of the format, or not valid UTF-8
    NO_METRIC = "no_metric"  # a valid record that does not carry the metric (or leaves it empty)
    TOO_LONG = "too_long"  # longer than ProgressConfig.max_line_bytes
    BLANK = "blank"  # empty or whitespace only
    HEADER = "header"  # a CSV header row
    # A CSV row that a header-extending rewrite (Lightning CSVLogger) wrote again.
    REPLAYED = "replayed"
    # An unterminated fragment the file lost (truncation, or a rotated-away file gone idle).
    PARTIAL = "partial"


def _no_skips() -> dict[SkipReason, int]:
    return dict.fromkeys(SkipReason, 0)


@dataclass(slots=True)
class ProgressStats:
    """Running counters of one tailer (or one whole-file read).

    Invariant: ``lines == samples + sum(skipped.values())``.
    """

    lines: int = 0
    samples: int = 0
    bytes_read: int = 0
    # Bytes passed over unread: the backlog a first poll skips (``ProgressConfig.max_poll_bytes``).
    bytes_skipped: int = 0
    # Times something other than a regular file (symlink, FIFO, device, socket, directory)
    # was found where a log belongs, and refused: each sighting once, not each poll.
    refused: int = 0
    skipped: dict[SkipReason, int] = field(default_factory=_no_skips)

    def skip(self, reason: SkipReason, count: int = 1) -> None:
        """Count ``count`` lines skipped for ``reason``."""
        self.lines += count
        self.skipped[reason] += count

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def add(self, other: ProgressStats) -> None:
        """Add ``other``'s counts into these (for per-directory totals)."""
        self.lines += other.lines
        self.samples += other.samples
        self.bytes_read += other.bytes_read
        self.bytes_skipped += other.bytes_skipped
        self.refused += other.refused
        for reason, count in other.skipped.items():
            self.skipped[reason] += count

    def as_dict(self) -> dict[str, int]:
        """Flat counters, e.g. for metrics or a heartbeat: ``skipped_nonfinite`` etc."""
        flat = {
            "lines": self.lines,
            "samples": self.samples,
            "bytes_read": self.bytes_read,
            "bytes_skipped": self.bytes_skipped,
            "refused": self.refused,
        }
        flat.update({f"skipped_{reason.value}": count for reason, count in self.skipped.items()})
        return flat


class UnreadableLogError(OSError):
    """A log that cannot be read at all here: e.g. a TensorBoard event file without the
    ``tensorboard`` extra. The message says what to do."""
