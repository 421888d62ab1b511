"""``progress.max_poll_bytes``: one poll reads at most that much of a log and the next polls
go on from where it stopped; a first poll of a longer log skips to its end (keeping the
format and a CSV header) -- the agent's first poll of a job only finds where its log ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specon.config import ProgressConfig, parse_policy
from specon.progress import DirectoryTailer, SkipReason, Tailer, read_file
from specon.progress.reader import READ_SIZE

CAP = 1 << 16


def records(first: int, count: int) -> bytes:
    return b"".join(
        json.dumps({"step": i, "loss": 1.0 / (i + 1)}).encode() + b"\n" for i in range(first, first + count)
    )


@pytest.mark.slow
def test_a_poll_reads_at_most_the_cap_and_the_next_ones_go_on(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(b"")
    with Tailer(log, ProgressConfig(max_poll_bytes=CAP)) as tailer:
        assert tailer.poll() == []
        data = records(0, 40_000)  # ~1.4 MB written between two polls
        log.write_bytes(data)

        steps: list[int | None] = []
        polls = 0
        while tailer.offset < len(data):
            before = tailer.stats.bytes_read
            steps += [s.step for s in tailer.poll()]
            polls += 1
            assert tailer.stats.bytes_read - before <= CAP

        assert steps == list(range(40_000))  # every line once, in order
        assert polls >= len(data) // CAP
        assert tailer.stats.bytes_skipped == 0


@pytest.mark.slow
def test_a_first_poll_of_a_long_log_skips_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(records(0, 100_000))  # ~3.5 MB of history
    with Tailer(log, ProgressConfig(max_poll_bytes=CAP)) as tailer:
        first = tailer.poll()

        assert tailer.offset == log.stat().st_size
        assert tailer.stats.bytes_read <= 2 * READ_SIZE
        assert tailer.stats.bytes_read + tailer.stats.bytes_skipped == log.stat().st_size
        assert first[-1].step == 99_999  # the newest lines are read, whole
        with log.open("ab") as fh:
            fh.write(records(100_000, 3))
        assert [s.step for s in tailer.poll()] == [100_000, 100_001, 100_002]
        assert tailer.stats.lines == tailer.stats.samples + tailer.stats.total_skipped


def test_a_skipped_csv_backlog_keeps_its_header(tmp_path: Path) -> None:
    log = tmp_path / "metrics.csv"
    rows = "".join(f"{i // 100},{i},{1.0 / (i + 1):.6f}\n" for i in range(100_000))
    log.write_text("epoch,step,train_loss\n" + rows)
    config = ProgressConfig(format="auto", metric="train_loss", max_poll_bytes=CAP)
    with Tailer(log, config) as tailer:
        tailer.poll()
        with log.open("a") as fh:
            fh.write("1000,100000,0.5\n")

        [sample] = tailer.poll()

        assert (sample.step, sample.value) == (100_000, 0.5)
        assert tailer.stats.skipped[SkipReason.UNPARSABLE] == 0


def test_a_first_poll_that_lands_on_a_line_start_loses_no_line(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    line = b'{"step": 1, "loss": 0.5}' + b" " * 39 + b"\n"  # 64 bytes: the jump lands on a line start
    log.write_bytes(line * (4 * CAP // len(line)))
    with Tailer(log, ProgressConfig(max_poll_bytes=CAP)) as tailer:
        got = tailer.poll()
        head = READ_SIZE // len(line)
        assert len(got) == head + min(READ_SIZE, CAP) // len(line)


def test_read_file_and_the_directory_tailer_with_backlog_all_never_skip(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(records(0, 20_000))
    config = ProgressConfig(max_poll_bytes=CAP)

    samples, stats = read_file(log, config)

    assert len(samples) == 20_000 and stats.bytes_skipped == 0
    with DirectoryTailer(tmp_path, config, backlog="all") as tailer:
        got = 0
        for _ in range(log.stat().st_size // CAP + 1):
            got += len(tailer.poll())
        assert got == 20_000 and tailer.stats.bytes_skipped == 0


def test_the_directory_tailer_starts_a_long_file_from_its_tail_by_default(tmp_path: Path) -> None:
    """A backlog of 20,000 records costs one bounded poll, which still yields the most recent
    samples (a window for Algorithm 1); what is appended later is read in full."""
    log = tmp_path / "progress.jsonl"
    log.write_bytes(records(0, 20_000))
    with DirectoryTailer(tmp_path, ProgressConfig(max_poll_bytes=CAP)) as tailer:
        first = tailer.poll()
        assert 0 < len(first) < 20_000 // 5 and tailer.stats.bytes_skipped > 0
        assert first[-1].step == 19_999, "the newest sample is in the first poll"
        with log.open("ab") as f:
            f.write(records(20_000, 50))
        later = tailer.poll()
        assert [s.step for s in later] == list(range(20_000, 20_050))
        # A short new file is read whole.
        (tmp_path / "b.jsonl").write_bytes(records(0, 10))
        assert len(tailer.poll()) == 10


def test_the_cap_is_a_policy_knob_that_must_be_positive(tmp_path: Path) -> None:
    head = "apiVersion: specon/v1alpha1\nkind: Policy\n"
    assert parse_policy(head + "progress: {max_poll_bytes: 4096}\n").progress.max_poll_bytes == 4096
    assert ProgressConfig().max_poll_bytes == 1 << 21
    with pytest.raises(ValueError, match=r"progress\.max_poll_bytes"):
        parse_policy(head + "progress: {max_poll_bytes: 0}\n")
    with pytest.raises(ValueError, match="max_poll_bytes"):
        Tailer(tmp_path / "log", ProgressConfig(max_poll_bytes=0))
