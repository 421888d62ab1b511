"""Choosing a parser: by name, or by looking at a file's first lines (``format: auto``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from specon.config import ProgressConfig
from specon.progress.csvlog import CsvParser, looks_like_header, sniff_delimiter, split_row
from specon.progress.jsonl import JsonlParser
from specon.progress.parser import LineParser, LogFormat
from specon.progress.text import TextParser

# How many non-blank lines detection looks at.
DETECT_LINES = 5

_PARSERS: dict[LogFormat, type[LineParser]] = {"jsonl": JsonlParser, "csv": CsvParser, "text": TextParser}


def make_parser(fmt: LogFormat, config: ProgressConfig) -> LineParser:
    """A fresh parser for ``fmt`` (``ValueError`` for an unknown name or a bad regex)."""
    try:
        cls = _PARSERS[fmt]
    except KeyError:
        raise ValueError(f"unknown progress format {fmt!r}; expected one of {sorted(_PARSERS)}") from None
    return cls(config)


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
