"""Free text matched by a regex: ``loss: 0.123``, ``loss=0.123``, ``Loss 0.123``,
``Epoch 3 ... loss: 1.2e-3``, PyTorch-example prints such as
``Train Epoch: 1 [0/60000 (0%)]\\tLoss: 2.305134``, and printed dicts: the Hugging Face
Trainer's console lines ``{'loss': '1.9', 'grad_norm': '0.9', 'learning_rate': '4e-05',
'epoch': '0.5'}`` (Python style, after its progress bars on the same line) or
``{"loss": 1.9, ...}`` (JSON style).

A line holding a flat ``{...}`` of quoted keys is read as that record: its key named as the
metric, its ``step`` (or ``global_step``, ``iteration``) the step; not its ``epoch``, which
the Trainer prints as a fraction. Other lines go through the pattern
``ProgressConfig.regex`` with ``{metric}`` replaced by the escaped metric name. The value
is the group named ``value`` if there is one, else group 1. Optional named groups ``step``
and ``ts`` fill the sample's step and time.

The metric's name comes from ``specon.progress.metric``: until it is chosen, the names in
front of a number (``name: 1.5``, ``name=1.5``, a printed dict's keys) are offered to the
rule, so ``train_loss: 0.5`` is read when a log has no ``loss``.
"""

from __future__ import annotations

import re
from typing import ClassVar

from specon.config import ProgressConfig
from specon.progress.fields import (
    STEP_KEYS,
    TS_KEYS,
    first_present,
    step_from,
    ts_from,
    value_from_text,
)
from specon.progress.metric import MetricChoice
from specon.progress.parser import LineParser, LogFormat
from specon.progress.samples import Sample, SkipReason

# A flat printed dict: braces with no braces or brackets inside.
_DICT = re.compile(r"\{([^{}\[\]]*)\}")
# One ``'key': value`` pair of it; the value quoted (the Trainer prints its numbers as
# strings since transformers 5) or bare up to the next comma.
_PAIR = re.compile(r"""(['"])([^'"]{1,200})\1\s*:\s*(?:'([^']*)'|"([^"]*)"|([^,'"]*))""")
# A name in front of a number (``lr: 0.1``, ``loss=0.5``): what a text log offers the rule.
# A match starts only where a name starts (the lookbehind), so a long run of word characters
# costs one attempt, not one per character.
_NAMED_NUMBER = re.compile(
    r"""(?<![\w./@\-])([A-Za-z_][\w./@\-]{0,99})['"]?\s*[:=]\s*['"]?[-+]?(?:\d|\.\d|nan\b|inf)""",
    re.IGNORECASE,
)


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


def printed_dict(text: str) -> dict[str, str] | None:
    """The pairs of the last flat ``{...}`` on the line with quoted keys, values as text."""
    matches = _DICT.findall(text)
    for body in reversed(matches):
        pairs = {m[2]: m[3] or m[4] or (m[5] or "").strip() for m in _PAIR.finditer(body)}
        if pairs:
            return pairs
    return None


class TextParser(LineParser):
    format: ClassVar[LogFormat] = "text"
    names: ClassVar[str] = "names"

    def __init__(self, config: ProgressConfig, *, choice: MetricChoice | None = None) -> None:
        super().__init__(config, choice=choice)
        self._compile(self.choice.metric)

    def _compile(self, metric: str) -> None:
        self._pattern_metric = metric
        self._pattern = compile_metric_regex(self.config.regex, metric)
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
        if "{" in text and (pairs := printed_dict(text)) is not None:
            metric = self.choice.offer(pairs)
            return SkipReason.NO_METRIC if metric is None else _from_pairs(pairs, metric)
        choice = self.choice
        match = self._pattern.search(text)
        if choice.chosen is None:
            if match is not None:
                choice.offer([self._pattern_metric])
            elif choice.offer(m.group(1) for m in _NAMED_NUMBER.finditer(text)) is not None:
                self._compile(choice.metric)
                match = self._pattern.search(text)
        elif choice.chosen != self._pattern_metric:  # chosen from a printed dict earlier
            self._compile(choice.chosen)
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


_DICT_STEP_KEYS = tuple(k for k in STEP_KEYS if k != "epoch")


def _from_pairs(pairs: dict[str, str], metric: str) -> Sample | SkipReason:
    if metric not in pairs:
        return SkipReason.NO_METRIC
    value = value_from_text(pairs[metric])
    if isinstance(value, SkipReason):
        return value
    return Sample(
        value, ts_from(first_present(pairs, TS_KEYS)), step_from(first_present(pairs, _DICT_STEP_KEYS))
    )
