"""A progress log read while its job writes: whole lines only, a broken one said."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.testing.progress_log import BrokenLogError, job_records, progress_records


def test_a_line_being_written_is_read_next_time(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    assert progress_records(log) == []  # no log yet
    log.write_text('{"step": 1, "loss": 0.5}\n\n{"step": 2, "loss": 0.4')  # a torn read
    assert progress_records(log) == [{"step": 1, "loss": 0.5}]
    with log.open("a") as f:
        f.write("}\n")
    assert progress_records(log) == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4}]


def test_a_whole_line_that_is_no_record_is_the_writers_fault(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_text('{"step": 1}\n{"step": 2, "lo\n')
    with pytest.raises(BrokenLogError, match="line 2"):
        progress_records(log)


def test_a_jobs_log_is_found_on_the_volume_where_every_runtime_writes_it(tmp_path: Path) -> None:
    log = tmp_path / "jobs" / "a" / "progress.jsonl"
    assert job_records(tmp_path, "a") == []
    log.parent.mkdir(parents=True)
    log.write_text('{"step": 1}\n')
    assert job_records(tmp_path, "a") == [{"step": 1}]
