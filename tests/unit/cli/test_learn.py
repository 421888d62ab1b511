"""``specon learn``: options, the weights file and curve it writes, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specon.cli.main import main
from specon.model import ContainerId
from specon.policy.dl2.network import read
from specon.policy.priority import dl2
from specon.policy.priority.base import JobProgress

TINY = [
    "--scenario",
    "A3",
    "--train-seeds",
    "1",
    "--validation-seeds",
    "1",
    "--imitation-epochs",
    "2",
    "--iterations",
    "1",
    "--episodes",
    "1",
    "--quiet",
]


@pytest.mark.slow
def test_learn_writes_weights_the_rule_can_use_and_its_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the curve's PNG needs the plot extra")
    out, curve, png = tmp_path / "w.npz", tmp_path / "curve.json", tmp_path / "curve.png"
    assert main(["learn", *TINY, "--out", str(out), "--json", str(curve), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "| imitation | 2 |" in text and "| rl | 1 |" in text and "kept: " in text
    _, header = read(out)
    assert header["config"]["scenarios"] == ["A3"]  # type: ignore[index]
    doc = json.loads(curve.read_text())
    assert [p["phase"] for p in doc["curve"]] == ["imitation", "imitation", "rl", "rl"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    jobs = [JobProgress(id=ContainerId(n), started=float(i), total=1000) for i, n in enumerate("abc")]
    assert sorted(dl2.weights(jobs, dl2.Args(weights=str(out)))) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--iterations", "-1"], "--iterations must be >= 0"),
        (["--train-seeds", "0"], "--train-seeds must be >= 1"),
        (["--scenario", "A9"], "unknown scenario 'A9'"),
        (["--scenario", "missing.yaml"], "missing.yaml"),
    ],
)
def test_bad_input_is_reported_with_status_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["learn", *argv, "--quiet", "--out", str(tmp_path / "w.npz")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w.npz").exists()


def test_learn_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["learn", "--help"])
    assert exc.value.code == 0
    assert "--imitation-epochs" in capsys.readouterr().out
