"""Choosing a parser: by name, or by looking at a file's first bytes and lines (``format: auto``).

``detect_kind`` tells the formats with framings of their own from the first bytes (a
TensorBoard event file, a JSON document such as ``trainer_state.json``); ``detect_format``
tells the line formats apart from the first lines.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Literal

from specon.config import ProgressConfig
from specon.progress.csvlog import CsvParser, looks_like_header, sniff_delimiter, split_row
from specon.progress.jsonl import JsonlParser
from specon.progress.metric import MetricChoice
from specon.progress.parser import LineParser, LogFormat
from specon.progress.text import TextParser

# How many non-blank lines detection looks at.
DETECT_LINES = 5
# How many first bytes ``detect_kind`` looks at.
SNIFF_BYTES = 4096
# The first record of an event file: its length (8 bytes, little-endian), a checksum (4),
# then an ``Event`` whose ``file_version`` is ``brain.Event:N``.
_EVENT_VERSION = b"brain.Event:"
_FIRST_RECORD_MAX = 1024

Kind = Literal["lines", "trainer_state", "tensorboard"]

_PARSERS: dict[LogFormat, type[LineParser]] = {"jsonl": JsonlParser, "csv": CsvParser, "text": TextParser}


def make_parser(fmt: LogFormat, config: ProgressConfig, choice: MetricChoice | None = None) -> LineParser:
    """A fresh parser for the line format ``fmt`` (``ValueError`` for an unknown name or a bad
    regex); ``choice``: the metric choice of the log it continues, if any."""
    try:
        cls = _PARSERS[fmt]
    except KeyError:
        raise ValueError(f"unknown progress format {fmt!r}; expected one of {sorted(_PARSERS)}") from None
    return cls(config, choice=choice)


def detect_kind(head: bytes, *, final: bool = False) -> Kind | None:
    """What a file is, from its first bytes (up to ``SNIFF_BYTES``): None while they cannot
    tell yet (``final``: the file is finished, so they must).

    - ``tensorboard``: the first record of an event file (a small length whose upper bytes
      are zero, then the ``brain.Event:`` version record);
    - ``trainer_state``: a JSON document written with an indent, whose first non-blank line
      is ``{`` alone (a JSON-lines file's first line is a whole object);
    - ``lines`` otherwise.
    """
    if len(head) >= 8 and head[4:8] == b"\0\0\0\0":
        (length,) = struct.unpack("<Q", head[:8])
        if 0 < length <= _FIRST_RECORD_MAX:
            if len(head) >= 12 + length:
                if _EVENT_VERSION in head[12 : 12 + length]:
                    return "tensorboard"
            elif not final:
                return None
    elif len(head) < 8 and b"\0" in head and not final:
        return None
    start = len(head) - len(head.lstrip())
    newline = head.find(b"\n", start)
    if newline < 0:
        if not final and len(head) < SNIFF_BYTES:
            return None
        first = head[start:]
    else:
        first = head[start:newline]
    return "trainer_state" if first.strip().removeprefix(b"\xef\xbb\xbf") == b"{" else "lines"


def detect_format(lines: Sequence[bytes]) -> LogFormat:
    """Guess the format from a file's first lines (blank lines ignored).

    - ``jsonl`` if one of the first non-blank lines is a JSON object;
    - ``csv`` if the first is a header of two or more column names and the next line,
      if any, has as many cells;
    - ``text`` otherwise (also for no lines at all).
    """
    texts: list[str] = []
    for line in lines:
        text = line.decode("utf-8", "replace").strip().removeprefix("\ufeff")
        if text:
            texts.append(text)
            if len(texts) == DETECT_LINES:
                break
    if not texts:
        return "text"
    if any(_is_json_object(text) for text in texts):
        return "jsonl"
    delimiter = sniff_delimiter(texts[0])
    header = split_row(texts[0], delimiter)
    if header is not None and looks_like_header(header, min_columns=2):
        row = split_row(texts[1], delimiter) if len(texts) > 1 else header
        if row is not None and len(row) == len(header):
            return "csv"
    return "text"


def _is_json_object(text: str) -> bool:
    if not text.startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False
