"""The incremental tailers: partial lines, late files, truncation, rotation, over-long lines,
format detection, directories, and exactly-once reading under any chunking."""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specon.config import ProgressConfig
from specon.progress import (
    CsvParser,
    DirectoryTailer,
    JsonlParser,
    LineParser,
    ProgressStats,
    Sample,
    SkipReason,
    Tailer,
    read_file,
)

JSONL = ProgressConfig(format="jsonl")


def record(step: int, loss: float | None = None) -> bytes:
    return json.dumps({"step": step, "loss": step / 8 if loss is None else loss}).encode() + b"\n"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def balanced(stats: ProgressStats) -> bool:
    return stats.lines == stats.samples + stats.total_skipped


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "progress.jsonl"


@pytest.fixture
def tailer(log: Path) -> Iterator[Tailer]:
    with Tailer(log, JSONL) as t:
        yield t


# --- the basics -------------------------------------------------------------------------------


def test_late_file_is_picked_up_when_it_appears(log: Path, tailer: Tailer) -> None:
    assert tailer.poll() == []
    assert tailer.poll() == []
    log.write_bytes(record(1))
    assert tailer.poll() == [Sample(0.125, step=1)]
    assert tailer.poll() == []


def test_partial_last_line_waits_for_its_newline(log: Path, tailer: Tailer) -> None:
    line = record(1)
    log.write_bytes(line[:5])
    assert tailer.poll() == []
    append(log, line[5:-1])
    assert tailer.poll() == []
    append(log, b"\n" + record(2))
    assert tailer.poll() == [Sample(0.125, step=1), Sample(0.25, step=2)]
    assert tailer.stats.lines == 2 and tailer.stats.bytes_read == len(line) + len(record(2))


def test_nonfinite_and_garbage_are_counted_never_returned(log: Path, tailer: Tailer) -> None:
    log.write_bytes(
        b'{"loss": NaN}\n{"loss": Infinity}\n{"loss": "-inf"}\n\x00\xff\xfe garbage\n\n'
        + record(3)
        + b'{"acc": 1}\n'
    )
    assert tailer.poll() == [Sample(0.375, step=3)]
    stats = tailer.stats
    assert stats.skipped[SkipReason.NONFINITE] == 3
    assert stats.skipped[SkipReason.UNPARSABLE] == 1
    assert stats.skipped[SkipReason.BLANK] == 1
    assert stats.skipped[SkipReason.NO_METRIC] == 1
    assert stats.lines == 7 and balanced(stats)


def test_over_long_lines_are_skipped_without_buffering(log: Path) -> None:
    config = ProgressConfig(format="jsonl", max_line_bytes=64)
    huge = b'{"loss": 1, "pad": "' + b"x" * 1000 + b'"}\n'
    with Tailer(log, config, read_size=16) as tailer:
        log.write_bytes(record(1) + huge[:300])
        assert tailer.poll() == [Sample(0.125, step=1)]
        assert tailer.stats.skipped[SkipReason.TOO_LONG] == 1  # counted as soon as it is too long
        append(log, huge[300:600])
        assert tailer.poll() == []
        append(log, huge[600:] + record(2) + huge + record(3))
        assert tailer.poll() == [Sample(0.25, step=2), Sample(0.375, step=3)]
        assert tailer.stats.skipped[SkipReason.TOO_LONG] == 2
        assert tailer.stats.lines == 5 and balanced(tailer.stats)


def test_a_line_of_exactly_the_limit_is_read(log: Path) -> None:
    line = record(1)
    with Tailer(log, ProgressConfig(format="jsonl", max_line_bytes=len(line) - 1), read_size=7) as tailer:
        log.write_bytes(line * 3)
        assert len(tailer.poll()) == 3


def test_truncation_starts_over_from_byte_zero(log: Path, tailer: Tailer) -> None:
    log.write_bytes(record(1) + record(2) + b'{"loss": 0.5')  # ends in a partial line
    assert len(tailer.poll()) == 2
    log.write_bytes(record(7))  # shorter than what was read: truncated and rewritten
    assert tailer.poll() == [Sample(7 / 8, step=7)]
    assert tailer.stats.skipped[SkipReason.PARTIAL] == 1  # the fragment the truncation cut off
    append(log, record(8))
    assert tailer.poll() == [Sample(1.0, step=8)]


def test_rewrite_to_a_longer_file_is_detected(log: Path, tailer: Tailer) -> None:
    log.write_bytes(record(1) + record(2))
    assert len(tailer.poll()) == 2
    log.write_bytes(b"".join(record(i, loss=9.0) for i in range(10, 20)))
    assert tailer.poll() == [Sample(9.0, step=i) for i in range(10, 20)]


def test_rotation_finishes_the_old_file_then_reads_the_new_one(log: Path, tailer: Tailer) -> None:
    log.write_bytes(record(1))
    assert len(tailer.poll()) == 1
    rotated = log.with_name("progress.jsonl.1")
    log.rename(rotated)  # logrotate: mv log log.1; the writer still has log.1 open ...
    append(rotated, record(2))
    log.write_bytes(record(3))  # ... until it reopens log
    append(rotated, record(4))
    assert [s.step for s in tailer.poll()] == [2, 4, 3]
    append(log, record(5))
    assert [s.step for s in tailer.poll()] == [5]
    append(rotated, record(6))  # the old file went idle and was closed: not read any more
    assert tailer.poll() == []
    assert tailer.rotations == 1


def test_deleted_file_then_recreated(log: Path, tailer: Tailer) -> None:
    log.write_bytes(record(1))
    assert len(tailer.poll()) == 1
    log.unlink()
    assert tailer.poll() == []
    assert tailer.poll() == []
    log.write_bytes(record(2))
    assert [s.step for s in tailer.poll()] == [2]


def test_a_directory_at_the_path_is_not_a_log(log: Path, tailer: Tailer) -> None:
    log.mkdir()
    assert tailer.poll() == []


def test_bad_config_fails_at_construction(log: Path) -> None:
    with pytest.raises(ValueError, match="group"):
        Tailer(log, ProgressConfig(format="text", regex="{metric}"))
    with pytest.raises(ValueError, match="max_line_bytes"):
        Tailer(log, ProgressConfig(max_line_bytes=0))


# --- formats through the tailer ---------------------------------------------------------------


def test_auto_detects_once_and_sticks(log: Path) -> None:
    with Tailer(log) as tailer:
        log.write_bytes(b"\n" + record(1))
        assert tailer.poll() == [Sample(0.125, step=1)]
        append(log, b"loss: 0.5\n" + record(2))  # text is not re-detected: unparsable JSON
        assert tailer.poll() == [Sample(0.25, step=2)]
        assert tailer.stats.skipped[SkipReason.UNPARSABLE] == 1


def test_auto_redetects_after_truncation(log: Path) -> None:
    with Tailer(log) as tailer:
        log.write_bytes(record(1) + record(2))
        assert len(tailer.poll()) == 2
        log.write_bytes(b"epoch 1 loss: 0.5\n")
        assert tailer.poll() == [Sample(0.5)]


def test_csv_header_is_reread_after_truncation(tmp_path: Path) -> None:
    log = tmp_path / "metrics.csv"
    with Tailer(log) as tailer:
        log.write_bytes(b"epoch,loss,acc\r\n0,0.9,0.1\r\n")
        assert tailer.poll() == [Sample(0.9, step=0)]
        log.write_bytes(b"acc,loss\r\n0.2,0.8\r\n")  # a new run with other columns
        assert tailer.poll() == [Sample(0.8)]


def test_lightning_header_rewrite_does_not_replay_old_rows(tmp_path: Path) -> None:
    log = tmp_path / "metrics.csv"
    before = b"epoch,step,train_loss\r\n0,49,0.69\r\n0,99,0.61\r\n"
    with Tailer(log, ProgressConfig(metric="train_loss")) as tailer:
        log.write_bytes(before)
        assert [s.step for s in tailer.poll()] == [49, 99]
        log.write_bytes(b"epoch,step,train_loss,val_loss\r\n0,49,0.69,\r\n0,99,0.61,\r\n0,99,,0.55\r\n")
        append(log, b"1,149,0.48,\r\n")
        assert tailer.poll() == [Sample(0.48, step=149)]
        assert tailer.stats.skipped[SkipReason.REPLAYED] == 2


def test_rotated_csv_without_header_keeps_the_old_header(tmp_path: Path) -> None:
    log = tmp_path / "training.log"
    with Tailer(log) as tailer:
        log.write_bytes(b"epoch,loss\r\n0,0.9\r\n")
        assert len(tailer.poll()) == 1
        log.rename(tmp_path / "training.log.1")
        log.write_bytes(b"1,0.5\r\n")  # the writer carries on without writing a header
        assert tailer.poll() == [Sample(0.5, step=1)]


def test_read_file_reads_an_unterminated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "done.log"
    path.write_bytes(b"loss: 1.0\nloss: 0.5")
    samples, stats = read_file(path)
    assert samples == [Sample(1.0), Sample(0.5)]
    assert stats.lines == 2 and balanced(stats)
    with pytest.raises(FileNotFoundError):
        read_file(tmp_path / "missing.log")


# --- directories -------------------------------------------------------------------------------


def test_directory_tailer_reads_every_matching_file_including_late_ones(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(record(1))
    (tmp_path / "notes.txt").write_bytes(b"loss: 99\n")
    (tmp_path / "sub.jsonl").mkdir()
    with DirectoryTailer(tmp_path, JSONL, pattern="*.jsonl") as tailer:
        assert [s.step for s in tailer.poll()] == [1]
        (tmp_path / "b.jsonl").write_bytes(record(2))
        append(tmp_path / "a.jsonl", record(3))
        assert [s.step for s in tailer.poll()] == [3, 2]
        assert [p.name for p in tailer.files] == ["a.jsonl", "b.jsonl"]
        assert tailer.stats.samples == 3


def test_directory_tailer_does_not_reread_a_rotated_file(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(record(1))
    with DirectoryTailer(tmp_path, JSONL) as tailer:
        assert len(tailer.poll()) == 1
        log.rename(tmp_path / "train.log.1")  # still matches "*": followed by inode, not name
        append(tmp_path / "train.log.1", record(2))
        log.write_bytes(record(3))
        assert sorted(s.step for s in tailer.poll() if s.step is not None) == [2, 3]
        assert tailer.poll() == []


def test_directory_tailer_on_a_missing_directory(tmp_path: Path) -> None:
    with DirectoryTailer(tmp_path / "later") as tailer:
        assert tailer.poll() == []
        (tmp_path / "later").mkdir()
        (tmp_path / "later" / "log").write_bytes(b"loss=0.5\n")
        assert tailer.poll() == [Sample(0.5)]


def test_directory_tailer_finishes_a_file_that_leaves(tmp_path: Path) -> None:
    log = tmp_path / "train.jsonl"
    log.write_bytes(record(1))
    with DirectoryTailer(tmp_path, JSONL, pattern="*.jsonl") as tailer:
        assert len(tailer.poll()) == 1
        moved = tmp_path / "train.jsonl.old"
        log.rename(moved)
        append(moved, record(2))
        assert [s.step for s in tailer.poll()] == [2]
        assert tailer.poll() == []
        assert tailer.files == []


# --- exactly once, whatever the chunking --------------------------------------------------------

# Lines as a job might write them, valid or not, never holding a newline.
junk = st.binary(max_size=30).map(lambda b: b.replace(b"\n", b""))
jsonl_lines = st.lists(
    st.one_of(
        st.integers(0, 10**6).map(lambda i: record(i)[:-1]),
        st.sampled_from([b'{"loss": NaN}', b"", b" ", b'{"acc": 1}', b'{"loss": "1e-3"}', b"\r"]),
        junk,
    ),
    max_size=40,
)
hypothesis_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def oracle(parser: LineParser, content: bytes) -> tuple[list[Sample], int]:
    """The samples and the number of complete lines that reading ``content`` line by line gives."""
    lines = content.split(b"\n")[:-1]  # the last piece has no newline: not (yet) a line
    results = [parser.parse(line) for line in lines]
    return [r for r in results if isinstance(r, Sample)], len(lines)


def cut(content: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(p % (len(content) + 1) for p in points), len(content)]
    return [content[a:b] for a, b in itertools.pairwise(bounds)]


def write_in_chunks(tailer: Tailer, path: Path, chunks: list[bytes]) -> list[Sample]:
    got: list[Sample] = []
    for chunk in chunks:
        append(path, chunk)
        got += tailer.poll()
    return got


@pytest.mark.slow
@hypothesis_settings
@given(lines=jsonl_lines, tail=junk, points=st.lists(st.integers(0, 10**4), max_size=12))
def test_any_chunking_reads_every_complete_line_once(
    lines: list[bytes], tail: bytes, points: list[int]
) -> None:
    content = b"".join(line + b"\n" for line in lines) + tail
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log"
        with Tailer(path, JSONL, read_size=8) as tailer:
            got = write_in_chunks(tailer, path, cut(content, points))
            got += tailer.poll()
            expected, count = oracle(JsonlParser(JSONL), content)
            assert got == expected
            assert tailer.stats.lines == count and balanced(tailer.stats)


csv_rows = st.lists(
    st.one_of(
        st.tuples(st.integers(0, 99), st.floats(allow_nan=True, allow_infinity=True)).map(
            lambda r: f"{r[0]},{r[1]!r},".encode()
        ),
        st.integers(0, 99).map(lambda i: f"{i},,0.5".encode()),  # a row logging another metric
        junk,
    ),
    max_size=30,
)


@pytest.mark.slow
@hypothesis_settings
@given(rows=csv_rows, points=st.lists(st.integers(0, 10**4), max_size=12))
def test_any_chunking_of_a_csv_log(rows: list[bytes], points: list[int]) -> None:
    content = b"".join(row + b"\r\n" for row in [b"step,loss,val_loss", *rows])
    config = ProgressConfig(format="csv")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "metrics.csv"
        with Tailer(path, config, read_size=8) as tailer:
            got = write_in_chunks(tailer, path, cut(content, points))
            expected, count = oracle(CsvParser(config), content)
            assert got == expected
            assert tailer.stats.lines == count


@pytest.mark.slow
@hypothesis_settings
@given(
    before=jsonl_lines,
    before_tail=junk,
    after=jsonl_lines,
    points=st.lists(st.integers(0, 10**4), max_size=6),
    first_after=st.integers(0, 10**4),
    poll_between=st.booleans(),
)
def test_truncation_reads_lines_before_and_after_once(
    *,
    before: list[bytes],
    before_tail: bytes,
    after: list[bytes],
    points: list[int],
    first_after: int,
    poll_between: bool,
) -> None:
    old = b"".join(line + b"\n" for line in before) + before_tail
    new = b"".join(line + b"\n" for line in after)
    head, rest = new[: first_after % (len(new) + 1)], new[first_after % (len(new) + 1) :]
    if not poll_between:
        # The rewrite must show: the file is shorter than what was read, or the bytes just
        # before the read offset changed (the tailer compares the last 64 it read).
        window = min(64, len(old))
        assume(len(head) < len(old) or head[len(old) - window : len(old)] != old[len(old) - window :])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log"
        with Tailer(path, JSONL, read_size=16) as tailer:
            got = write_in_chunks(tailer, path, cut(old, points))
            path.write_bytes(b"")  # truncate (O_TRUNC) and rewrite
            if poll_between:
                got += tailer.poll()
            got += write_in_chunks(tailer, path, [head, *cut(rest, points)])
            got += tailer.poll()
            parser = JsonlParser(JSONL)
            expected_old, _ = oracle(parser, old)
            expected_new, _ = oracle(parser, new)
            assert got == expected_old + expected_new


@pytest.mark.slow
@hypothesis_settings
@given(
    before=jsonl_lines,
    before_tail=junk,
    extra=jsonl_lines,
    after=jsonl_lines,
    points=st.lists(st.integers(0, 10**4), max_size=6),
    poll_before_new=st.booleans(),
)
def test_rotation_reads_old_then_new_lines_once(
    *,
    before: list[bytes],
    before_tail: bytes,
    extra: list[bytes],
    after: list[bytes],
    points: list[int],
    poll_before_new: bool,
) -> None:
    old = b"".join(line + b"\n" for line in before) + before_tail
    # The writer may still append to the rotated file (completing its partial line) until
    # the tailer has seen the rotation and read it once more.
    more = b"".join(line + b"\n" for line in extra)
    new = b"".join(line + b"\n" for line in after)
    with tempfile.TemporaryDirectory() as d:
        path, rotated = Path(d) / "log", Path(d) / "log.1"
        with Tailer(path, JSONL, read_size=16) as tailer:
            got = write_in_chunks(tailer, path, cut(old, points))
            os.rename(path, rotated)
            append(rotated, more)
            if poll_before_new:
                got += tailer.poll()
            got += write_in_chunks(tailer, path, cut(new, points))
            got += tailer.poll() + tailer.poll()
            parser = JsonlParser(JSONL)
            expected_old, old_lines = oracle(parser, old + more)
            expected_new, new_lines = oracle(parser, new)
            assert got == expected_old + expected_new
            assert tailer.stats.lines == old_lines + new_lines + (
                not (old + more).endswith(b"\n") and bool(old + more)
            )
