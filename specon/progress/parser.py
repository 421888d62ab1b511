"""The shapes of a format's reader: ``Decoder`` (what every format has), ``LineParser`` (a
format read line by line) and ``WholeFile`` (a format read by its own framing: a JSON
document rewritten whole, TensorBoard's records)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar, Literal

from specon.config import ProgressConfig
from specon.progress.metric import MetricChoice
from specon.progress.samples import ProgressStats, Sample, SkipReason

LogFormat = Literal["jsonl", "csv", "text", "trainer_state", "tensorboard"]
# The formats read line by line (``format:`` in a policy may name these; the others are
# recognised by their content only).
LINE_FORMATS: tuple[LogFormat, ...] = ("jsonl", "csv", "text")


class Decoder(abc.ABC):
    """Turns one file's content into samples of one metric (``choice``)."""

    format: ClassVar[LogFormat]
    # What the format calls the names it carries, for messages.
    names: ClassVar[str] = "keys"

    def __init__(self, config: ProgressConfig, *, choice: MetricChoice | None = None) -> None:
        self.config = config
        self.choice = choice if choice is not None else MetricChoice(config.metric)

    def restart(self, *, rewritten: bool) -> Decoder:
        """The decoder for the file starting over: ``rewritten`` in place (truncated, or
        rewritten by its writer) or replaced by a new file (rotation)."""
        del rewritten
        return self

    def continues(self, lines: Sequence[bytes]) -> bool:
        """Whether a restarted file that begins with ``lines`` still reads as this format
        even though it would not be detected as such (a rotated CSV without its header row)."""
        del lines
        return False


class LineParser(Decoder):
    """Turns one log line (bytes, without its newline) into a ``Sample`` or a ``SkipReason``.

    Parsers never raise on bad input. A CSV parser is stateful (its first line is the
    header), so each file being read gets its own parser.
    """

    def __init__(self, config: ProgressConfig, *, choice: MetricChoice | None = None) -> None:
        super().__init__(config, choice=choice)
        self._max_line = config.max_line_bytes

    @abc.abstractmethod
    def parse(self, line: bytes) -> Sample | SkipReason:
        """Parse one line. A trailing ``\\r`` and surrounding whitespace are ignored."""

    def parse_block(self, block: bytes, out: list[Sample], stats: ProgressStats) -> None:
        """Parse ``block`` (one or more lines joined by ``\\n``), appending samples to ``out``.

        Gives exactly the results of ``parse`` line by line; formats override it with a
        faster path.
        """
        parse = self.parse
        skipped = stats.skipped
        lines = block.split(b"\n")
        found = 0
        for line in lines:
            result = parse(line)
            if isinstance(result, Sample):
                out.append(result)
                found += 1
            else:
                skipped[result] += 1
        stats.lines += len(lines)
        stats.samples += found

    def restart(self, *, rewritten: bool) -> LineParser:
        del rewritten
        return self


class WholeFile(Decoder):
    """A format read by its own framing from one open file (not line by line).

    ``read`` is given the file and its size at each poll; it reads what is new, appends the
    samples and counts every record in ``stats``, and says how far it has read (``offset``).
    """

    offset = 0

    @abc.abstractmethod
    def read(self, fd: int, size: int, out: list[Sample], stats: ProgressStats, limit: int | None) -> int:
        """Read what is new (at most ``limit`` bytes where the format allows); the bytes read."""

    def flush(self, fd: int, out: list[Sample], stats: ProgressStats) -> None:
        """The file is finished: count what could not be read (a torn last record)."""
        del fd, out, stats
