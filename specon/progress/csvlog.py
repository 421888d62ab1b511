"""CSV with a header row: Keras ``CSVLogger`` (``epoch,loss,val_loss``) and Lightning
``CSVLogger``'s ``metrics.csv`` (``epoch,step,train_loss,val_loss``, where a row that logs
other metrics leaves the metric's cell empty: that row is a "no metric" skip).

The parser is stateful: the first non-blank line is the header. The delimiter (``,``,
``;`` or tab) is sniffed from the header. The metric's column is chosen from the header
(``specon.progress.metric``): Lightning's ``train_loss_step`` when there is no ``loss``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from typing import ClassVar

from specon.config import ProgressConfig
from specon.progress.fields import STEP_KEYS, TS_KEYS, step_from, ts_from, value_from_text
from specon.progress.metric import MetricChoice
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import Sample, SkipReason

DELIMITERS = (",", ";", "\t")
# A column name: starts like an identifier; the punctuation loggers put in metric names
# (``val/loss``, ``lr-Adam``, ``acc@1``) is allowed; ``:``/``=``/spaces are not, so
# free-text lines do not pass for headers.
_COLUMN_NAME = re.compile(r"[A-Za-z_][\w.\-/@\[\]()]*")


def sniff_delimiter(header: str) -> str:
    """The most frequent of ``,`` ``;`` tab in ``header`` (``,`` if none occurs)."""
    return max(DELIMITERS, key=header.count)


def split_row(line: str, delimiter: str) -> list[str] | None:
    """The cells of one CSV line, or None if it is not valid CSV."""
    if '"' not in line:
        return line.split(delimiter)
    try:
        return next(csv.reader([line], delimiter=delimiter, strict=True))
    except (csv.Error, StopIteration):
        return None


def is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def looks_like_header(cells: Sequence[str], *, min_columns: int = 1) -> bool:
    """Every cell a column name (not a number, not free text)."""
    return len(cells) >= min_columns and all(_COLUMN_NAME.fullmatch(cell.strip()) for cell in cells)


def looks_like_data(cells: Sequence[str]) -> bool:
    """Every cell a number or empty (a header-less data row)."""
    return all(not cell.strip() or is_number(cell) for cell in cells)


class CsvParser(LineParser):
    format: ClassVar[LogFormat] = "csv"
    names: ClassVar[str] = "columns"

    def __init__(
        self,
        config: ProgressConfig,
        *,
        choice: MetricChoice | None = None,
        previous_header: tuple[str, ...] | None = None,
        previous_delimiter: str = ",",
        previous_rows: int = 0,
        previous_first_row: dict[str, str] | None = None,
    ) -> None:
        """``previous_*`` describe the file before it started over (see ``restart``)."""
        super().__init__(config, choice=choice)
        self._header: tuple[str, ...] | None = None
        self._delimiter = ","
        self._metric_col: int | None = None
        self._step_col: int | None = None
        self._ts_col: int | None = None
        self._rows = 0  # data rows of this file so far
        self._first_row: dict[str, str] | None = None  # cells by column name
        self._replayed = 0  # leading data rows to skip as already read
        self._previous_header = previous_header
        self._previous_delimiter = previous_delimiter
        self._previous_rows = previous_rows
        self._previous_first_row = previous_first_row

    @property
    def header(self) -> tuple[str, ...] | None:
        return self._header

    def restart(self, *, rewritten: bool) -> CsvParser:
        """A fresh parser that remembers this file's header, for two cases seen in practice:

        - Lightning's CSVLogger rewrites ``metrics.csv`` in place with a wider header when
          new metric keys appear, then appends. If a rewritten file's header strictly
          extends the old one and its first row repeats the old first row, its first rows
          (as many as were read before) are the old rows again and are skipped as
          ``replayed``.
        - copytruncate or a rotation leaves a CSV without its header row: a first line of
          numbers with the old column count is read with the old header.
        """
        if self._header is None:  # nothing read since the last restart: pass on what we had
            header, delimiter = self._previous_header, self._previous_delimiter
            rows, first_row = self._previous_rows, self._previous_first_row
        else:
            # Rows we know of: those read, or more if a replay was still under way.
            header, delimiter = self._header, self._delimiter
            rows, first_row = max(self._rows, self._replayed), self._first_row
        return CsvParser(
            self.config,
            choice=self.choice,
            previous_header=header,
            previous_delimiter=delimiter,
            previous_rows=rows if rewritten else 0,
            previous_first_row=first_row if rewritten else None,
        )

    def continues(self, lines: Sequence[bytes]) -> bool:
        header = self._header or self._previous_header
        if header is None:
            return False
        delimiter = self._delimiter if self._header else self._previous_delimiter
        for line in lines:
            text = _decode(line)
            if text is None:
                return False
            if text.strip():
                cells = split_row(text, delimiter)
                return cells is not None and len(cells) == len(header) and looks_like_data(cells)
        return False

    def _set_header(self, header: tuple[str, ...], delimiter: str) -> None:
        self._header = header
        self._delimiter = delimiter
        metric = self.choice.offer(header)
        self._metric_col = None if metric is None else _index(header, (metric,))
        self._step_col = _index(header, STEP_KEYS)
        self._ts_col = _index(header, TS_KEYS)

    def parse(self, line: bytes) -> Sample | SkipReason:
        if len(line) > self._max_line:
            return SkipReason.TOO_LONG
        text = _decode(line)
        if text is None:
            return SkipReason.UNPARSABLE
        if not text.strip():
            return SkipReason.BLANK
        if self._header is None:
            return self._first_line(text)
        cells = split_row(text, self._delimiter)
        if cells is None or len(cells) != len(self._header):
            return SkipReason.UNPARSABLE
        return self._row(cells)

    def _first_line(self, text: str) -> Sample | SkipReason:
        text = text.removeprefix("\ufeff")
        previous = self._previous_header
        if previous is not None:
            cells = split_row(text, self._previous_delimiter)
            if cells is not None and len(cells) == len(previous) and looks_like_data(cells):
                self._set_header(previous, self._previous_delimiter)
                return self._row(cells)
        delimiter = sniff_delimiter(text)
        cells = split_row(text, delimiter)
        if cells is None or not looks_like_header(cells):
            return SkipReason.UNPARSABLE
        header = tuple(cell.strip() for cell in cells)
        self._set_header(header, delimiter)
        if previous is not None and set(header) > set(previous):
            self._replayed = self._previous_rows
        return SkipReason.HEADER

    def _row(self, cells: list[str]) -> Sample | SkipReason:
        self._rows += 1
        if self._rows == 1:
            assert self._header is not None
            self._first_row = {name: cell.strip() for name, cell in zip(self._header, cells, strict=True)}
            old = self._previous_first_row
            if self._replayed and (old is None or any(self._first_row.get(k) != v for k, v in old.items())):
                self._replayed = 0  # a new run with more columns, not a rewrite of the old rows
        if self._rows <= self._replayed:
            return SkipReason.REPLAYED
        if self._metric_col is None:
            return SkipReason.NO_METRIC
        value = value_from_text(cells[self._metric_col])
        if isinstance(value, SkipReason):
            return value
        step = None if self._step_col is None else step_from(cells[self._step_col])
        ts = None if self._ts_col is None else ts_from(cells[self._ts_col])
        return Sample(value, ts, step)


def _decode(line: bytes) -> str | None:
    """The line as text without its ``\r`` (not stripped further: a tab may be a delimiter)."""
    try:
        return line.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        return None


def _index(header: tuple[str, ...], names: tuple[str, ...]) -> int | None:
    """The column of the first of ``names`` that ``header`` has."""
    for name in names:
        if name in header:
            return header.index(name)
    return None
