"""JSON lines: one flat JSON object per line, e.g. ``{"step": 10, "loss": 0.5, "ts": 1700000000.1}``.

The metric is the top-level key named exactly as chosen (``specon.progress.metric``: so
``val/loss`` or ``train_loss`` match literally; nested objects are not searched). Records
before the first one with a key the rule accepts carry no metric.
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from specon.progress.fields import (
    STEP_KEYS,
    TS_KEYS,
    first_present,
    sample_from_record,
    step_from,
    ts_from,
    value_from_json,
)
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import ProgressStats, Sample, SkipReason


class JsonlParser(LineParser):
    format: ClassVar[LogFormat] = "jsonl"

    def parse(self, line: bytes) -> Sample | SkipReason:
        if len(line) > self._max_line:
            return SkipReason.TOO_LONG
        try:
            # json.loads(bytes) decodes the same way, so both paths agree on odd input.
            text = line.decode("utf-8", "surrogatepass").strip().removeprefix("\ufeff")
        except UnicodeDecodeError:
            return SkipReason.UNPARSABLE
        if not text:
            return SkipReason.BLANK
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            return SkipReason.UNPARSABLE
        if not isinstance(record, dict):
            return SkipReason.UNPARSABLE
        return self._from_record(record)

    def _from_record(self, record: dict[str, Any]) -> Sample | SkipReason:
        metric = self.choice.offer(record)
        if metric is None:
            return SkipReason.NO_METRIC
        return sample_from_record(record, metric)

    def parse_block(self, block: bytes, out: list[Sample], stats: ProgressStats) -> None:
        records = self._load_block(block)
        if records is None:
            super().parse_block(block, out, stats)
            return
        # The hot loop: common shapes (float metric, int step, float ts) inline, anything
        # else through the same helpers ``parse`` uses.
        choice = self.choice
        metric = choice.chosen
        isfinite = math.isfinite
        append = out.append
        skipped = stats.skipped
        no_step = frozenset(STEP_KEYS).isdisjoint
        no_ts = frozenset(TS_KEYS).isdisjoint
        found = 0
        for record in records:
            if metric is None:
                metric = choice.offer(record)
                if metric is None:
                    skipped[SkipReason.NO_METRIC] += 1
                    continue
            value = record.get(metric)
            if type(value) is not float or not isfinite(value):
                result = value_from_json(value)
                if isinstance(result, SkipReason):
                    skipped[result] += 1
                    continue
                value = result
            step = record.get("step")
            if type(step) is not int:
                step = None if no_step(record) else step_from(first_present(record, STEP_KEYS))
            ts = record.get("ts")
            if type(ts) is not float or not isfinite(ts):
                ts = None if no_ts(record) else ts_from(first_present(record, TS_KEYS))
            append(Sample(value, ts, step))
            found += 1
        stats.lines += len(records)
        stats.samples += found

    def _load_block(self, block: bytes) -> list[dict[str, Any]] | None:
        """Decode every line of ``block`` with one ``json.loads`` call, or None if that
        cannot be done safely (the caller then goes line by line).

        Safe means the array holds exactly one object per line: each line starts with
        ``{``, ends with ``}``, and the block has no other braces and no brackets. JSON
        strings cannot hold a raw newline, so the ``},\\n{`` joints sit outside strings and
        every line is one whole object, exactly what ``json.loads(line)`` would return.
        """
        lines = block.count(b"\n") + 1
        if (
            block[:1] != b"{"
            or block[-1:] != b"}"
            or block.count(b"{") != lines
            or block.count(b"}") != lines
            or block.count(b"}\n{") != lines - 1
            or b"[" in block
            or b"]" in block
        ):
            return None
        if len(block) > self._max_line and max(map(len, block.split(b"\n"))) > self._max_line:
            return None
        try:
            records: list[dict[str, Any]] = json.loads(b"[" + block.replace(b"}\n{", b"},\n{") + b"]")
        except (ValueError, RecursionError):
            return None
        return records
