"""Hugging Face ``trainer_state.json``: one JSON document whose ``log_history`` lists the
Trainer's logs (``{"loss": 0.69, "grad_norm": 0.15, "learning_rate": 0.0047, "epoch": 0.25,
"step": 5}``; evaluations as ``{"eval_loss": 0.17, ..., "step": 20}``), written whole at each
checkpoint save (``checkpoint-N/trainer_state.json``).

A poll that finds the file changed (size, modification or change time) reads it whole again
(at most ``MAX_DOCUMENT_BYTES``) and reads the entries it has not read before: those after
the entries already read when the new history still holds them (the same run saved again, or
a newer copy renamed over the old one), else those past the last step read (a run resumed
from an older checkpoint), else all (another run). Each entry counts as one line. A
document caught half-written is read again at its next change; one that stays unreadable
is counted ``unparsable`` once.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar

from specon.config import ProgressConfig
from specon.progress.fields import sample_from_record, step_from
from specon.progress.metric import MetricChoice
from specon.progress.parser import LogFormat, WholeFile
from specon.progress.samples import ProgressStats, Sample, SkipReason

# Far above a real trainer_state.json (100,000 log entries are about 15 MB).
MAX_DOCUMENT_BYTES = 64 << 20

Version = tuple[int, int, int]  # (size, mtime_ns, ctime_ns)


class TrainerStateFile(WholeFile):
    format: ClassVar[LogFormat] = "trainer_state"

    def __init__(
        self,
        config: ProgressConfig,
        *,
        choice: MetricChoice | None = None,
        previous: TrainerStateFile | None = None,
    ) -> None:
        """``previous``: the reader of the file this one replaces, whose entries were read."""
        super().__init__(config, choice=choice)
        self._version: Version | None = None  # the version last read
        self._broken: Version | None = None  # the version last read, if it was unreadable
        self._broken_counted = False
        self._read_entries: int = previous._read_entries if previous else 0
        self._last: Any = previous._last if previous else None  # the last entry read
        self._last_step: int | None = previous._last_step if previous else None

    def read(self, fd: int, size: int, out: list[Sample], stats: ProgressStats, limit: int | None) -> int:
        del limit  # a document is read whole or not at all
        st = os.fstat(fd)
        version = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if version == self._version:
            if self._broken == version:  # unreadable since the last poll: not a write under way
                self._count_broken(stats)
            return 0
        self._version = version
        self.offset = size
        if size == 0:  # truncated for a rewrite, or not written yet
            return 0
        if size > MAX_DOCUMENT_BYTES:
            self._broken, self._broken_counted = version, True
            stats.skip(SkipReason.TOO_LONG)
            return 0
        data = _read_all(fd, size)
        history = _history(data)
        if history is None:
            self._broken, self._broken_counted = version, False
            return len(data)
        self._broken = None
        self._read_history(history, out, stats)
        return len(data)

    def flush(self, fd: int, out: list[Sample], stats: ProgressStats) -> None:
        del fd, out
        if self._broken is not None:
            self._count_broken(stats)

    def _count_broken(self, stats: ProgressStats) -> None:
        if not self._broken_counted:
            self._broken_counted = True
            stats.skip(SkipReason.UNPARSABLE)

    def _read_history(self, history: list[Any], out: list[Sample], stats: ProgressStats) -> None:
        start = self._new_from(history)
        choice = self.choice
        for entry in history[start:]:
            stats.lines += 1
            if not isinstance(entry, dict):
                stats.skipped[SkipReason.UNPARSABLE] += 1
                continue
            step = step_from(entry.get("step"))
            if step is not None and (self._last_step is None or step > self._last_step):
                self._last_step = step
            metric = choice.offer(entry)
            result = SkipReason.NO_METRIC if metric is None else sample_from_record(entry, metric)
            if isinstance(result, Sample):
                out.append(result)
                stats.samples += 1
            else:
                stats.skipped[result] += 1
        if history:
            self._read_entries, self._last = len(history), history[-1]

    def _new_from(self, history: list[Any]) -> int:
        """The index of the first entry not read before."""
        n = self._read_entries
        if n == 0 or (n <= len(history) and history[n - 1] == self._last):
            return n
        last_step = self._last_step
        if last_step is None:
            return 0
        for i, entry in enumerate(history):
            step = step_from(entry.get("step")) if isinstance(entry, dict) else None
            if step is not None and step > last_step:
                return i
        return len(history)


def _read_all(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        data = os.pread(fd, min(1 << 20, size - offset), offset)
        if not data:
            break
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks)


def _history(data: bytes) -> list[Any] | None:
    """The ``log_history`` list of a trainer state, or None if ``data`` is not one."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return None
    history = document.get("log_history") if isinstance(document, dict) else None
    return history if isinstance(history, list) else None
