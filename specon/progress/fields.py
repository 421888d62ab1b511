"""Turning the raw cells of a record (JSON values, CSV cells) into a value, a step and a time.

Shared by the JSON-lines and CSV parsers so both read ``step``/``ts`` the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime

from specon.progress.samples import Sample, SkipReason

# Tried in order; the first key present (and not null/empty) wins.
STEP_KEYS = ("step", "global_step", "iteration", "iter", "epoch")
TS_KEYS = ("ts", "time", "timestamp")
# Cells that say "not logged" (Keras CSVLogger writes ``NA`` for a missing key).
MISSING = frozenset({"na", "n/a", "none", "null"})


def value_from_text(text: str) -> float | SkipReason:
    """A metric cell: empty or ``NA`` -> no metric; not a number -> unparsable; NaN/inf -> nonfinite."""
    text = text.strip()
    if not text or text.lower() in MISSING:
        return SkipReason.NO_METRIC
    try:
        value = float(text)
    except ValueError:
        return SkipReason.UNPARSABLE
    return value if math.isfinite(value) else SkipReason.NONFINITE


def value_from_json(raw: object) -> float | SkipReason:
    """A decoded JSON value: numbers and numeric strings count; null means "not logged here"."""
    if raw is None:
        return SkipReason.NO_METRIC
    if isinstance(raw, bool):
        return SkipReason.UNPARSABLE
    if isinstance(raw, float):
        return raw if math.isfinite(raw) else SkipReason.NONFINITE
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:  # an integer beyond float range is, as a float, infinite
            return SkipReason.NONFINITE
    if isinstance(raw, str):
        return value_from_text(raw)
    return SkipReason.UNPARSABLE


def step_from(raw: object) -> int | None:
    """An integral step from an int, an integral float or a numeric string; else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        text = raw.strip()
        try:
            return int(text)
        except ValueError:
            try:
                raw = float(text)
            except ValueError:
                return None
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        return int(raw)
    return None


def ts_from(raw: object) -> float | None:
    """Epoch seconds from a number, a numeric string or an ISO-8601 string; else None.

    A naive ISO time is read as local time (``datetime.timestamp``'s convention).
    """
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        try:
            ts = float(raw)
        except OverflowError:
            return None
        return ts if math.isfinite(ts) else None
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    try:
        ts = float(text)
    except ValueError:
        try:
            ts = datetime.fromisoformat(text).timestamp()
        except (ValueError, OverflowError, OSError):
            return None
    return ts if math.isfinite(ts) else None


def first_present(record: Mapping[str, object], keys: tuple[str, ...]) -> object:
    """The value of the first of ``keys`` that ``record`` holds as non-null, non-empty; else None."""
    for key in keys:
        raw = record.get(key)
        if raw is not None and raw != "":
            return raw
    return None


def sample_from_record(record: Mapping[str, object], metric: str) -> Sample | SkipReason:
    """The sample of one decoded record (a JSON line, a ``log_history`` entry, a printed dict)."""
    value = value_from_json(record.get(metric))
    if isinstance(value, SkipReason):
        return value
    return Sample(value, ts_from(first_present(record, TS_KEYS)), step_from(first_present(record, STEP_KEYS)))
