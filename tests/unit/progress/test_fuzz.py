"""Random bytes into every parser and into the tailer: nothing escapes, every line is counted,
no non-finite value comes out, and the fast block paths agree with line-by-line parsing."""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from specon.config import ProgressConfig
from specon.progress import (
    CsvParser,
    JsonlParser,
    LineParser,
    ProgressStats,
    Sample,
    SkipReason,
    Tailer,
    TextParser,
    detect_format,
    make_parser,
)
from specon.progress.detect import detect_kind
from specon.progress.parser import LogFormat

fuzz_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMATS: tuple[LogFormat, ...] = ("jsonl", "csv", "text")

line_bytes = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b""))
# Bytes built from JSON's own punctuation and the metric name, to reach the JSON fast path
# and the corners of the CSV and text grammars far more often than uniform bytes do.
tokens = st.sampled_from(
    [
        *(b"{", b"}", b"[", b"]", b'"', b'"loss"', b'"step"', b'"ts"', b":", b",", b" ", b"\r", b"\t", b";"),
        *(b"0.5", b"-1e3", b"NaN", b"Infinity", b"null", b"true", b"\\", b"\xff", b"loss", b"=", b"epoch"),
    ]
)
grammar_line = st.lists(tokens, max_size=14).map(b"".join)
json_value = st.one_of(
    st.floats(),
    st.integers(-(10**400), 10**400),
    st.text(max_size=8),
    st.none(),
    st.booleans(),
    st.sampled_from(["2024-01-01T00:00:00Z", "1e999", "nan", "3.0"]),
)
json_line = st.dictionaries(
    st.sampled_from(["loss", "step", "epoch", "iteration", "ts", "time", "timestamp", "acc"]), json_value
).map(lambda d: json.dumps(d).encode())
any_line = st.one_of(line_bytes, grammar_line, json_line)


def parsers() -> list[LineParser]:
    config = ProgressConfig(max_line_bytes=40)
    return [JsonlParser(config), CsvParser(config), TextParser(config)]


def finite(samples: list[Sample]) -> bool:
    return all(math.isfinite(s.value) for s in samples)


@pytest.mark.slow
@fuzz_settings
@given(lines=st.one_of(st.lists(any_line, max_size=12), st.lists(json_line, min_size=1, max_size=12)))
def test_parsers_never_raise_and_block_equals_line_by_line(lines: list[bytes]) -> None:
    # CSV is stateful: separate instances for the two readings.
    for by_line, by_block in zip(parsers(), parsers(), strict=True):
        results = [by_line.parse(line) for line in lines]
        assert all(isinstance(r, Sample | SkipReason) for r in results)
        if not lines:
            continue
        out: list[Sample] = []
        stats = ProgressStats()
        by_block.parse_block(b"\n".join(lines), out, stats)
        assert out == [r for r in results if isinstance(r, Sample)]
        assert finite(out)
        assert stats.lines == len(lines) == stats.samples + stats.total_skipped
        assert [stats.skipped[reason] for reason in SkipReason] == [
            sum(r is reason for r in results) for reason in SkipReason
        ]


@pytest.mark.slow
@fuzz_settings
@given(lines=st.lists(any_line, max_size=8))
def test_detect_format_never_raises(lines: list[bytes]) -> None:
    fmt = detect_format(lines)
    assert fmt in FORMATS
    make_parser(fmt, ProgressConfig())


@pytest.mark.slow
@fuzz_settings
@given(
    content=st.one_of(st.binary(max_size=400), st.lists(any_line, max_size=20).map(b"\n".join)),
    points=st.lists(st.integers(0, 400), max_size=10),
    fmt=st.sampled_from(["auto", *FORMATS]),
    truncate_at=st.none() | st.integers(0, 400),
)
@example(content=b"\n{", points=[], fmt="auto", truncate_at=None)  # a document to auto (run 26)
@example(content=b"\t{\n\x00", points=[3], fmt="auto", truncate_at=None)  # one read at each change
def test_tailer_survives_random_bytes(
    content: bytes, points: list[int], fmt: LogFormat, truncate_at: int | None
) -> None:
    config = ProgressConfig(format=fmt, max_line_bytes=24)
    bounds = [0, *sorted(p % (len(content) + 1) for p in points), len(content)]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log"
        with Tailer(path, config, read_size=7) as tailer:
            got: list[Sample] = []
            for i, (a, b) in enumerate(itertools.pairwise(bounds)):
                with path.open("ab") as f:
                    f.write(content[a:b])
                if truncate_at is not None and i == 1:
                    with path.open("r+b") as f:
                        f.truncate(truncate_at % (len(content) + 1))
                got += tailer.poll()
            got += tailer.flush()
            stats = tailer.stats
            assert finite(got)
            assert stats.samples == len(got)
            assert stats.lines == stats.samples + stats.total_skipped
            if truncate_at is None:
                # Without truncation, in a log of lines every byte is read once and every line
                # counted once (the unterminated last one by flush). One whose first non-blank
                # line is "{" alone is a JSON document to ``auto`` (a Trainer's state file, read
                # whole at each change): b"\n{" is one unparsable document, not two lines, and
                # b"\t{\n" then b"\x00" is read twice, 3 bytes then 4 (run at 1743723).
                if fmt != "auto" or detect_kind(content, final=True) == "lines":
                    assert stats.bytes_read == len(content)
                    newlines = content.count(b"\n")
                    assert stats.lines == newlines + (not content.endswith(b"\n") and bool(content))
                else:
                    assert stats.bytes_read >= len(content)
