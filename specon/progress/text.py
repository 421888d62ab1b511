"""Free text matched by a regex: ``loss: 0.123``, ``loss=0.123``, ``Loss 0.123``,
``Epoch 3 ... loss: 1.2e-3``, PyTorch-example prints such as
``Train Epoch: 1 [0/60000 (0%)]\\tLoss: 2.305134``.

The pattern is ``ProgressConfig.regex`` with ``{metric}`` replaced by the escaped metric
name. The value is the group named ``value`` if there is one, else group 1. Optional
named groups ``step`` and ``ts`` fill the sample's step and time.
"""

from __future__ import annotations

import re
from typing import ClassVar

from specon.config import ProgressConfig
from specon.progress.fields import step_from, ts_from, value_from_text
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import Sample, SkipReason


def compile_metric_regex(regex: str, metric: str) -> re.Pattern[str]:
    """Compile a text-format pattern for ``metric``; a clear ``ValueError`` if it is unusable."""
    source = regex.replace("{metric}", re.escape(metric))
    try:
        pattern = re.compile(source)
    except re.error as exc:
        raise ValueError(f"progress regex {source!r} does not compile: {exc}") from exc
    if pattern.groups < 1:
        raise ValueError(f"progress regex {source!r} needs a group capturing the value")
    return pattern


class TextParser(LineParser):
    format: ClassVar[LogFormat] = "text"

    def __init__(self, config: ProgressConfig) -> None:
        super().__init__(config)
        self._pattern = compile_metric_regex(config.regex, config.metric)
        names = self._pattern.groupindex
        self._value_group: int | str = "value" if "value" in names else 1
        self._step_group = "step" if "step" in names else None
        self._ts_group = "ts" if "ts" in names else None

    def parse(self, line: bytes) -> Sample | SkipReason:
        if len(line) > self._max_line:
            return SkipReason.TOO_LONG
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            return SkipReason.UNPARSABLE
        if not text.strip():
            return SkipReason.BLANK
        match = self._pattern.search(text)
        if match is None:
            return SkipReason.NO_METRIC
        raw = match.group(self._value_group)
        if raw is None:  # the value group sits in an alternative that did not match
            return SkipReason.NO_METRIC
        value = value_from_text(raw)
        if isinstance(value, SkipReason):
            # An empty capture is a pattern that matched without a number: unparsable.
            return SkipReason.UNPARSABLE if value is SkipReason.NO_METRIC else value
        step = None if self._step_group is None else step_from(match.group(self._step_group))
        ts = None if self._ts_group is None else ts_from(match.group(self._ts_group))
        return Sample(value, ts, step)
