"""The last record of a progress log: half-written tails, missing files, events."""

from __future__ import annotations

import os
from pathlib import Path

from specon.progress.last import last_event, last_record, read_records


def test_a_half_written_last_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "p.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n{"event": "finished", "step": 1}\n{"step": 2, "lo')
    assert last_record(log) == {"event": "finished", "step": 1}
    assert last_event(log) == "finished"


def test_a_missing_or_eventless_log_has_no_event(tmp_path: Path) -> None:
    assert last_record(tmp_path / "nope") is None
    log = tmp_path / "p.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n')
    assert last_event(log) is None
    log.write_bytes(b"\xff\xfe garbage\n[1, 2]\n")
    assert last_record(log) is None


def test_only_the_tail_is_read(tmp_path: Path) -> None:
    log = tmp_path / "p.jsonl"
    log.write_text('{"event": "started"}\n' + "x" * 10_000 + "\n")
    assert last_record(log, tail_bytes=100) is None


def test_read_records_never_waits_on_a_fifo_or_follows_a_symlink(tmp_path: Path) -> None:
    fifo = tmp_path / "progress.jsonl"
    os.mkfifo(fifo)  # planted by the job: a read would wait for a writer for ever
    assert read_records(fifo) == []
    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"step": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    assert read_records(link) == [] and read_records(target) == [{"step": 1}]
