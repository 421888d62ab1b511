"""``specon config validate | defaults | show``: output and exit codes."""

from __future__ import annotations

import argparse
import io
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from specon.cli import cmd_config
from specon.config import API_VERSION, Mode, default_policy, parse_policy

GOOD = f"apiVersion: {API_VERSION}\nkind: Policy\nmonitor: {{alpha: 0.05}}\n"
BAD = (
    f"apiVersion: {API_VERSION}\nkind: Policy\n"
    "monitor: {alpha: -1, alhpa: 2}\n"
    "messaging: {worker_timeout: 1}\n"
)


def run(argv: list[str]) -> int:
    # Only this command's parser: the test does not depend on the other commands.
    parser = argparse.ArgumentParser(prog="specon")
    cmd_config.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return cast(Callable[[argparse.Namespace], int], args.func)(args)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"good": tmp_path / "good.yaml", "bad": tmp_path / "bad.yaml"}
    out["good"].write_text(GOOD)
    out["bad"].write_text(BAD)
    return out


def test_validate_ok(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "validate", str(files["good"])]) == 0
    assert capsys.readouterr().out == f"{files['good']}: ok\n"


def test_validate_lists_every_error_and_fails(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["config", "validate", str(files["good"]), str(files["bad"])]) == 1
    out, err = capsys.readouterr()
    assert out == f"{files['good']}: ok\n"
    assert err.startswith(f"{files['bad']}: 3 errors\n")
    for path in ("monitor.alpha:", "monitor.alhpa:", "messaging.worker_timeout:"):
        assert f"\n  {path}" in err


def test_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "validate", str(tmp_path / "nope.yaml")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_validate_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(GOOD))
    assert run(["config", "validate", "-"]) == 0
    assert capsys.readouterr().out == "<stdin>: ok\n"


@pytest.mark.parametrize("mode", ["default", "paper"])
def test_defaults_output_revalidates(mode: Mode, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "defaults", "--mode", mode]) == 0
    text = capsys.readouterr().out
    assert "#" in text
    assert parse_policy(text) == default_policy(mode)


def test_defaults_without_comments(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "defaults", "--no-comments"]) == 0
    text = capsys.readouterr().out
    assert "#" not in text
    assert parse_policy(text) == default_policy()


def test_defaults_rejects_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(["config", "defaults", "--mode", "fast"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_show_prints_the_effective_policy(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "show", str(files["good"])]) == 0
    text = capsys.readouterr().out
    policy = parse_policy(text)
    assert policy.monitor.alpha == 0.05
    assert policy.monitor.interval == 30.0  # filled in
    assert "(default mode: 0.01)" in text


def test_show_invalid_file_fails(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["config", "show", str(files["bad"])]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "monitor.alpha" in err


@pytest.mark.parametrize("argv", [["config"], ["config", "validate"], ["config", "show"]])
def test_missing_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    "argv", [["config"], ["config", "validate"], ["config", "defaults"], ["config", "show"]]
)
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run([*argv, "--help"])
    assert info.value.code == 0
    assert "usage:" in capsys.readouterr().out
