"""The last record of a progress log: half-written tails, missing files, events."""

from __future__ import annotations

from pathlib import Path

from specon.progress.last import last_event, last_record


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
