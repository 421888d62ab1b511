"""The one shape every log format's parser has."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar, Literal

from specon.config import ProgressConfig
from specon.progress.samples import ProgressStats, Sample, SkipReason

LogFormat = Literal["jsonl", "csv", "text"]


class LineParser(abc.ABC):
    """Turns one log line (bytes, without its newline) into a ``Sample`` or a ``SkipReason``.

    Parsers never raise on bad input. A CSV parser is stateful (its first line is the
    header), so each file being read gets its own parser.
    """

    format: ClassVar[LogFormat]

    def __init__(self, config: ProgressConfig) -> None:
        self.config = config
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
        """The parser for the file starting over: ``rewritten`` in place (truncated, or
        rewritten by its writer) or replaced by a new file (rotation)."""
        del rewritten
        return self

    def continues(self, lines: Sequence[bytes]) -> bool:
        """Whether a restarted file that begins with ``lines`` still reads as this parser's format
        even though it would not be detected as such (a rotated CSV without its header row)."""
        del lines
        return False
