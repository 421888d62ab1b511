"""The shared volume's records, the job spec, and the launcher that records exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.model import ContainerId, Resources, WorkerId
from specon.runtime import JobPaths, JobSpec
from specon.runtime.base import valid_job_id
from specon.runtime.local import launcher
from specon.runtime.local.launcher import EXEC_FAILED, ExitRecord
from specon.runtime.volume import CorruptRecordError, Owner, iter_job_ids

LAUNCHER = Path(launcher.__file__)


@pytest.mark.parametrize("good", ["a", "vae-1", "J.2_x", "x" * 253])
def test_valid_job_ids(good: str) -> None:
    assert valid_job_id(good) == good


@pytest.mark.parametrize(
    "bad",
    ["", ".", "..", "../x", "a/b", "-x", ".hidden", "x" * 254, "sp ace", "ü", "job-1\n", "a\ud800", "\x00"],
)
def test_invalid_job_ids_are_refused_with_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid job id"):
        valid_job_id(bad)
    with pytest.raises(ValueError, match="invalid job id"):
        JobSpec(id=ContainerId(bad), command=("x",))


_names = st.text("abcxyz019._-", min_size=1, max_size=12).filter(lambda s: s[0].isalnum())
_text = st.text(min_size=1, max_size=12)


_specs = st.builds(
    JobSpec,
    id=_names,
    command=st.lists(_text, min_size=1, max_size=4).map(tuple),
    env=st.lists(st.tuples(_text, st.text(max_size=8)), max_size=3).map(tuple),
    requests=st.builds(Resources, cpu=st.floats(0, 64), memory=st.integers(0, 2**40)),
    labels=st.just((("metric", "loss"),)),
    steps=st.none() | st.integers(0, 10**6),
    model=st.none() | _text,
)


@settings(max_examples=50, deadline=None)
@given(spec=_specs)
def test_job_spec_survives_json(spec: JobSpec) -> None:
    assert JobSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"id": "a", "command": []},
        {"id": "a", "command": ["x"], "steps": "many"},
        {"id": "a", "command": ["x"], "requests": {"cpu": "nan"}},
        {"id": "../a", "command": ["x"]},
        [],
    ],
)
def test_bad_job_specs_are_clear_errors(raw: object) -> None:
    with pytest.raises(ValueError, match="job"):
        JobSpec.from_json(raw)


def test_owner_round_trip_clear_and_corruption(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    assert paths.read_owner() is None
    owner = Owner(WorkerId("w0"), "run1", 12.5, "boot", pid=42, start_ticks=99)
    paths.write_owner(owner)
    assert paths.read_owner() == owner
    paths.clear_owner()
    paths.clear_owner()  # idempotent
    assert paths.read_owner() is None
    paths.owner.write_text('{"worker": "w0"')
    with pytest.raises(CorruptRecordError, match=r"owner\.json"):
        paths.read_owner()


# Written by the hand-written serialisers before the codec (json.dumps(..., sort_keys=True)).
OLD_OWNER = (
    b'{"handle": null, "host": "boot-1", "pid": 42, "run_id": "run1", "start_ticks": 99, '
    b'"started_at": 12.5, "worker": "w0"}'
)
OLD_SPEC = (
    b'{"command": ["python", "-m", "x"], "env": [["A", "1"]], "id": "j1", '
    b'"labels": [["metric", "loss"]], "model": "vae", '
    b'"requests": {"cpu": 0.5, "gpu": 0, "memory": 1073741824}, "steps": 3}'
)
OLD_K8S_SPEC = (
    b'{"command": ["pod"], "env": [], "id": "j1", "labels": [], "model": null, '
    b'"requests": {"cpu": 1, "gpu": 0, "memory": 0}, "selector": [["zone", "a"]], "steps": null, '
    b'"template": "{}", "tolerations": ["gpu:NoSchedule"]}'
)


def test_old_owner_and_spec_files_read_and_are_written_byte_for_byte(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    paths.owner.write_bytes(OLD_OWNER)
    owner = Owner(WorkerId("w0"), "run1", 12.5, "boot-1", pid=42, start_ticks=99)
    assert paths.read_owner() == owner
    paths.write_owner(owner)
    assert paths.owner.read_bytes() == OLD_OWNER
    spec = JobSpec(
        id=ContainerId("j1"),
        command=("python", "-m", "x"),
        env=(("A", "1"),),
        requests=Resources(cpu=0.5, memory=1 << 30),
        labels=(("metric", "loss"),),
        steps=3,
        model="vae",
    )
    for raw, want in [
        (OLD_SPEC, spec),
        (
            OLD_K8S_SPEC,
            JobSpec(
                id=ContainerId("j1"),
                command=("pod",),
                requests=Resources(cpu=1.0),
                template="{}",
                selector=(("zone", "a"),),
                tolerations=("gpu:NoSchedule",),
            ),
        ),
    ]:
        paths.spec.write_bytes(raw)
        assert paths.read_spec() == want
        paths.write_spec(want)
        assert paths.spec.read_bytes() == raw.replace(b'"cpu": 1,', b'"cpu": 1.0,')


def test_owner_and_spec_errors_name_every_field(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    paths.owner.write_text('{"worker": 3, "run_id": "r", "started_at": "soon", "newer": 1}')
    with pytest.raises(
        CorruptRecordError, match=r"owner\.json: worker: expected a string.*started_at: .*host: missing"
    ):
        paths.read_owner()
    paths.spec.write_text('{"id": "j1", "command": ["x", 2], "steps": "many", "newer": true}')
    with pytest.raises(CorruptRecordError, match=r"spec\.json: bad job spec: command\[1\]: .*; steps: "):
        paths.read_spec()


def test_spec_file_round_trip_and_missing(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    with pytest.raises(CorruptRecordError, match="missing"):
        paths.read_spec()
    spec = JobSpec(id=ContainerId("j1"), command=("python", "-m", "x"), steps=3)
    paths.write_spec(spec)
    assert paths.read_spec() == spec


def test_exit_records_skip_bad_lines_and_find_a_run(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    first = ExitRecord("r1", "w0", 5, 0, None, "exited", 1.0)
    paths.append_exit(first)
    with open(paths.exits, "a") as fh:
        fh.write("not json\n\n")
    paths.append_exit(ExitRecord("r1", "w0", 5, None, 9, "killed", 2.0))
    paths.append_exit(ExitRecord("r2", "w1", 6, 3, None, "exited", 3.0))
    records, bad = paths.read_exits()
    assert (len(records), bad) == (3, 1)
    assert paths.exit_of("r1") == first
    assert paths.exit_of("nope") is None


@pytest.mark.parametrize(
    ("log", "finished"),
    [
        (None, False),
        ('{"step": 1, "loss": 0.5}\n', False),
        ('{"step": 1}\n{"event": "finished", "step": 1}\n', True),
        ('{"event": "finished", "step": 1}\n{"step": 2, "lo', True),  # a torn last line
        ('{"event": "finished"}\n{"event": "resumed", "step": 0}\n', False),
        ("loss: 0.1\n", False),
    ],
)
def test_finished_reads_the_last_progress_record(tmp_path: Path, log: str | None, finished: bool) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    if log is not None:
        paths.progress.write_text(log)
    assert paths.finished() is finished


def test_done_marker_means_finished(tmp_path: Path) -> None:
    paths = JobPaths.of(tmp_path, "j1")
    paths.create()
    paths.done.write_text("")
    assert paths.finished()


def test_job_ids_on_the_volume_skip_foreign_names(tmp_path: Path) -> None:
    for name in ("b", "a", ".tmp", "bad name"):
        (tmp_path / "jobs" / name).mkdir(parents=True)
    assert list(iter_job_ids(tmp_path)) == ["a", "b"]
    assert list(iter_job_ids(tmp_path / "empty")) == []


def launch(tmp_path: Path, *command: str) -> tuple[int, list[ExitRecord]]:
    exits = tmp_path / "exits.jsonl"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCHER), str(exits), "run-1", "w0", "--", *command],
        capture_output=True,
        timeout=30,
        check=False,
    )
    lines = exits.read_text().splitlines() if exits.exists() else []
    return proc.returncode, [ExitRecord.decode(line) for line in lines]


def test_launcher_records_the_exit_status(tmp_path: Path) -> None:
    code, [record] = launch(tmp_path, sys.executable, "-c", "raise SystemExit(3)")
    assert code == 3
    assert (record.run_id, record.worker, record.exit_code, record.signal, record.reason) == (
        "run-1",
        "w0",
        3,
        None,
        "exited",
    )


def test_launcher_records_a_signal_death(tmp_path: Path) -> None:
    code, [record] = launch(tmp_path, sys.executable, "-c", "import os; os.kill(os.getpid(), 9)")
    assert code == 128 + 9
    assert (record.exit_code, record.signal) == (None, 9)


def test_launcher_records_a_command_that_cannot_run(tmp_path: Path) -> None:
    code, [record] = launch(tmp_path, str(tmp_path / "no-such-binary"))
    assert code == record.exit_code == EXEC_FAILED


def test_launcher_without_a_command_is_a_usage_error(tmp_path: Path) -> None:
    code, records = launch(tmp_path)
    assert (code, records) == (2, [])
