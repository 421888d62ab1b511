"""``specon asgd model`` and ``specon asgd sim``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from specon.cli import cmd_asgd


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specon")
    cmd_asgd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


MODEL = [
    "asgd",
    "model",
    "--worker",
    "0.029",
    "--uplink",
    "0.072",
    "--server",
    "0.018",
    "--downlink",
    "0.072",
]


def test_model_prints_the_table_and_choices(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _run([*MODEL, "--max-workers", "5", "--json", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "| 5 | 6 |" in out and "KNEE" in out and "HELL" in out
    doc = json.loads((tmp_path / "m.json").read_text())
    assert len(doc["throughput"]["exact"]) == 5
    assert doc["throughput"]["hybrid"][0] == pytest.approx(1 / 0.191)


@pytest.mark.parametrize(
    ("extra", "match"),
    [(["--max-workers", "0"], "workers"), (["--alpha", "2"], "alpha")],
)
def test_model_bad_input(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([*MODEL, *extra]) == 2
    assert match in capsys.readouterr().err


def test_model_bad_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*MODEL]
    argv[argv.index("--worker") + 1] = "-1"
    assert _run(argv) == 2
    assert "worker" in capsys.readouterr().err


def test_sim_prints_load_table_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "s.json"
    argv = ["asgd", "sim", "--policy", "knee", "--load", "0.2", "--jobs", "60", "--seeds", "1", "--quiet"]
    assert _run([*argv, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "| 0.2 |" in out and "load 0.2: stable" in out
    doc = json.loads(out_json.read_text())
    assert doc["policy"] == "knee" and doc["points"][0]["stable"] is True


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--load", "abc"], "--load"),
        (["--load", "0"], "--load"),
        (["--seeds", "0"], "--seeds"),
        (["--policy", "srpt", "--mode", "moldable"], "moldable"),
        (["--gamma", "-1"], "gamma"),
        (["--jobs", "3"], "jobs"),
    ],
)
def test_sim_bad_input(extra: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["asgd", "sim", "--quiet", *extra]) == 2
    assert match in capsys.readouterr().err
