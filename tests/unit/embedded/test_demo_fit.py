"""``specon demo`` fits its jobs to the machine: each model's steps scaled by how much slower
this machine trains it than the machine the recorded traces came from."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from specon.cli import cmd_demo
from specon.cli.main import build_parser, main
from specon.embedded.demo import machine_speed, step_factors


def test_a_slower_machine_shrinks_each_model_by_its_own_slowdown_and_a_faster_one_keeps_all() -> None:
    nominal = {"gru": 0.024, "vae": 0.023, "rnn": 0.024}
    got = step_factors({"gru": 0.096, "vae": 0.046, "rnn": 0.012}, nominal)
    assert got == pytest.approx({"gru": 0.25, "vae": 0.5, "rnn": 1.0})


def test_a_model_without_a_recorded_or_a_measured_speed_keeps_its_steps() -> None:
    assert step_factors({"gru": 0.1, "vae": 0.0}, {"vae": 0.02}) == {"gru": 1.0, "vae": 1.0}


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for the interpreter: it runs ``body`` as a shell script."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_speeds_come_from_the_timing_process(tmp_path: Path) -> None:
    out = json.dumps({"gru": 0.05, "vae": 0.07})
    python = fake_python(tmp_path, f"echo '{out}'")
    assert machine_speed(["gru", "vae"], python=python) == {"gru": 0.05, "vae": 0.07}


@pytest.mark.parametrize(
    "body",
    [
        "exit 3",  # it failed
        "echo 'not json'",
        "echo '[0.05]'",  # not an object
        """echo '{"gru": 0.05}'""",  # a model missing
        """echo '{"gru": 0.05, "vae": -1.0}'""",  # not a speed
        """echo '{"gru": 0.05, "vae": "fast"}'""",
    ],
)
def test_no_speed_is_trusted_from_a_timing_process_that_failed_or_said_something_else(
    tmp_path: Path, body: str
) -> None:
    assert machine_speed(["gru", "vae"], python=fake_python(tmp_path, body)) is None


def test_a_missing_interpreter_is_no_speed(tmp_path: Path) -> None:
    assert machine_speed(["gru"], python=str(tmp_path / "nothing-here")) is None


def test_no_fit_is_an_option_and_fitting_the_default() -> None:
    assert build_parser().parse_args(["demo"]).no_fit is False
    assert build_parser().parse_args(["demo", "--no-fit"]).no_fit is True


def test_a_bad_option_fails_before_the_models_are_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_timing(models: list[str]) -> dict[str, float]:
        raise AssertionError("timed the models before checking the options")

    monkeypatch.setattr(cmd_demo, "_fit_to_machine", no_timing)
    assert main(["demo", "--policy", "nope", "--out", str(tmp_path)]) == 2
    assert main(["demo", "--lose", "w9@5", "--out", str(tmp_path)]) == 2
