"""``specon trace record --out``: the current directory by default, never the shipped traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.cli.main import build_parser, main
from specon.sim.trace import DEFAULT_TRACE_DIR


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def test_the_default_output_is_the_current_directory() -> None:
    args = build_parser().parse_args(["trace", "record"])
    assert args.out == Path(".")


@pytest.mark.parametrize(
    "out", [DEFAULT_TRACE_DIR, DEFAULT_TRACE_DIR / "sub", DEFAULT_TRACE_DIR / ".." / "traces"]
)
def test_the_shipped_traces_are_never_written(capsys: pytest.CaptureFixture[str], out: Path) -> None:
    before = snapshot(DEFAULT_TRACE_DIR)
    assert (
        main(["trace", "record", "--models", "vae", "--seeds", "0", "--steps", "2", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err
    assert "traces shipped with specon" in err and "never overwritten" in err
    assert snapshot(DEFAULT_TRACE_DIR) == before  # refused before any training
    assert not (DEFAULT_TRACE_DIR / "sub").exists()


@pytest.mark.slow
def test_a_recording_lands_in_the_current_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = snapshot(DEFAULT_TRACE_DIR)
    monkeypatch.chdir(tmp_path)
    assert main(["trace", "record", "--models", "vae", "--seeds", "0", "--steps", "10", "--stride", "5"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["vae-seed0.json"]
    assert "vae-seed0.json: 10 steps, 2 losses" in capsys.readouterr().out
    assert snapshot(DEFAULT_TRACE_DIR) == before
