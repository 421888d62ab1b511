"""The formats read whole rather than line by line: what ``detect_kind`` recognises,
``trainer_state.json`` rewritten and replaced, and TensorBoard event files cut short,
oversized or unreadable without the extra."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest

from specon.config import ProgressConfig
from specon.progress import Sample, SkipReason, Tailer, UnreadableLogError, read_log
from specon.progress.detect import detect_kind
from specon.progress.trainer_state import MAX_DOCUMENT_BYTES

FRAMEWORKS = Path(__file__).resolve().parents[2] / "data" / "frameworks"
LIGHTNING_EVENTS = FRAMEWORKS / "lightning" / "events.out.tfevents.lightning"


def entry(step: int, loss: float | None = None) -> dict[str, Any]:
    if loss is None:
        return {"epoch": step / 10, "eval_loss": 1 / step, "step": step}
    return {"epoch": step / 10, "grad_norm": 0.5, "learning_rate": 1e-3, "loss": loss, "step": step}


def state(history: list[dict[str, Any]]) -> bytes:
    """A trainer state as the Trainer writes it (``TrainerState.save_to_json``)."""
    document = {"epoch": 1.0, "global_step": history[-1]["step"] if history else 0, "log_history": history}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


HISTORY = [entry(5, 0.9), entry(10, 0.7), entry(10), entry(15, 0.5), entry(20, 0.4), entry(20)]


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"", None),
        (b"{", None),  # the first line is not complete yet
        (b'{\n  "epoch": 1.0,', "trainer_state"),
        (b'{"step": 1, "loss": 0.5}\n', "lines"),
        (b"epoch,loss\n", "lines"),
        (b"\x18\x00\x00\x00\x00\x00\x00\x00", None),  # an event file's first length, no more yet
        (LIGHTNING_EVENTS.read_bytes()[:4096], "tensorboard"),
        (b"\x18\x00\x00\x00\x00\x00\x00\x00abcd" + b"x" * 24 + b"\n", "lines"),  # framed, no event
    ],
)
def test_detect_kind(head: bytes, kind: str | None) -> None:
    assert detect_kind(head) == kind


def test_detect_kind_decides_at_the_end_of_a_finished_file() -> None:
    assert detect_kind(b"", final=True) == "lines"
    assert detect_kind(b"loss 0.5", final=True) == "lines"
    assert detect_kind(b"{", final=True) == "trainer_state"


# --- trainer_state.json ---------------------------------------------------------------------


def test_a_trainer_state_rewritten_whole_gives_each_entry_once(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    with Tailer(path) as tailer:
        path.write_bytes(state(HISTORY[:2]))
        assert tailer.poll() == [Sample(0.9, step=5), Sample(0.7, step=10)]
        assert tailer.poll() == []  # unchanged: not read again
        path.write_bytes(state(HISTORY))  # truncated and written again, as the Trainer does
        assert tailer.poll() == [Sample(0.5, step=15), Sample(0.4, step=20)]
        assert tailer.decoder is not None and tailer.decoder.format == "trainer_state"
        stats = tailer.stats
    assert (stats.lines, stats.samples, stats.skipped[SkipReason.NO_METRIC]) == (6, 4, 2)


def test_a_newer_trainer_state_renamed_over_the_old_one_continues(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"  # the agent reads whatever the job puts at its path
    with Tailer(path) as tailer:
        path.write_bytes(state(HISTORY[:3]))
        assert len(tailer.poll()) == 2
        new = tmp_path / "new"
        new.write_bytes(state(HISTORY))
        new.rename(path)  # checkpoint-N+1's state copied over atomically
        assert tailer.poll() == [Sample(0.5, step=15), Sample(0.4, step=20)]
        assert tailer.rotations == 1


def test_a_run_resumed_from_an_older_checkpoint_gives_only_later_steps(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    with Tailer(path) as tailer:
        path.write_bytes(state(HISTORY[:5]))
        assert len(tailer.poll()) == 4
        # Resumed from checkpoint-10: its history ends at step 10, then new steps follow.
        resumed = [*HISTORY[:3], entry(15, 0.55), entry(20, 0.45), entry(25, 0.35)]
        path.write_bytes(state(resumed))
        assert tailer.poll() == [Sample(0.35, step=25)]


def test_a_half_written_trainer_state_waits_for_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    whole = state(HISTORY)
    with Tailer(path) as tailer:
        path.write_bytes(whole[: len(whole) // 2])
        assert tailer.poll() == []
        path.write_bytes(whole)
        assert len(tailer.poll()) == 4
        assert tailer.stats.skipped[SkipReason.UNPARSABLE] == 0  # a write under way is no error


def test_a_broken_trainer_state_is_counted_once(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_bytes(b'{\n  "log_history": 3\n}\n')
    with Tailer(path) as tailer:
        for _ in range(3):
            assert tailer.poll() == []
        assert tailer.stats.skipped[SkipReason.UNPARSABLE] == 1
    got = read_log(path)  # a finished file says so at once
    assert (got.samples, got.stats.skipped[SkipReason.UNPARSABLE], got.format) == ([], 1, "trainer_state")


def test_an_oversized_trainer_state_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    with path.open("wb") as f:
        f.write(b'{\n  "log_history": [\n')
        f.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: nothing is written
    got = read_log(path)
    assert (got.samples, got.stats.skipped[SkipReason.TOO_LONG], got.stats.bytes_read) == ([], 1, 0)


# --- TensorBoard event files ----------------------------------------------------------------


def test_an_event_file_appended_in_pieces_gives_every_scalar_once(tmp_path: Path) -> None:
    data = LIGHTNING_EVENTS.read_bytes()
    whole = read_log(LIGHTNING_EVENTS)
    assert whole.format == "tensorboard" and whole.choice.chosen == "train_loss_step"
    path = tmp_path / "events.out.tfevents.1"
    got: list[Sample] = []
    with Tailer(path) as tailer:
        for start in range(0, len(data), 333):  # cuts records (and the first header) anywhere
            with path.open("ab") as f:
                f.write(data[start : start + 333])
            got += tailer.poll()
        assert tailer.offset == len(data)
        assert tailer.stats.lines == whole.stats.lines and tailer.stats.skipped[SkipReason.PARTIAL] == 0
    assert got == whole.samples and len(got) == 64
    assert all(s.ts is not None and s.step is not None for s in got)


def test_an_event_file_longer_than_a_poll_is_read_over_several(tmp_path: Path) -> None:
    config = ProgressConfig(max_poll_bytes=1000)
    whole = read_log(LIGHTNING_EVENTS)
    got: list[Sample] = []
    with Tailer(LIGHTNING_EVENTS, config) as tailer:
        polls = 0
        while tailer.offset < LIGHTNING_EVENTS.stat().st_size:
            got += tailer.poll()
            polls += 1
            assert polls < 100
    assert got == whole.samples and polls > 5  # from its start: no record boundary mid-file


def test_an_event_file_cut_short_counts_a_partial_record(tmp_path: Path) -> None:
    data = LIGHTNING_EVENTS.read_bytes()
    path = tmp_path / "events.out.tfevents.cut"
    path.write_bytes(data[:-5])
    got, whole = read_log(path), read_log(LIGHTNING_EVENTS)
    assert got.stats.lines == whole.stats.lines  # all but the last record, and the partial one
    assert got.stats.skipped[SkipReason.PARTIAL] == 1 and whole.stats.skipped[SkipReason.PARTIAL] == 0
    assert got.samples == whole.samples[: len(got.samples)]


def test_a_record_claiming_too_much_stops_the_file_without_reading_it(tmp_path: Path) -> None:
    data = LIGHTNING_EVENTS.read_bytes()
    (first,) = struct.unpack("<Q", data[:8])
    path = tmp_path / "events.out.tfevents.huge"
    # A valid first record, then a length field claiming 2**62 bytes.
    path.write_bytes(data[: 16 + first] + struct.pack("<Q", 1 << 62) + b"\0" * 64)
    got = read_log(path)
    assert (got.samples, got.stats.skipped[SkipReason.TOO_LONG], got.stats.skipped[SkipReason.HEADER]) == (
        [],
        1,
        1,
    )


def test_without_the_extra_an_event_file_is_refused_with_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from specon.progress import tfevents  # noqa: PLC0415

    monkeypatch.setattr(tfevents, "_MISSING", ImportError("No module named 'tensorboard'"))
    with pytest.raises(UnreadableLogError, match=r"pip install 'specon\[tensorboard\]'"):
        read_log(LIGHTNING_EVENTS)
    path = tmp_path / "events.out.tfevents.1"
    path.write_bytes(LIGHTNING_EVENTS.read_bytes())
    with Tailer(path) as tailer:  # the agent: no crash, the reason in ``error``, tried again
        assert tailer.poll() == [] and tailer.poll() == []
        assert tailer.error is not None and "tensorboard extra" in tailer.error
    assert os.path.exists(path)
