"""matplotlib is the optional ``plot`` extra: without it, the plotting commands name the extra
to install (before doing any work) instead of crashing, and nothing else needs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specon.cli.main import main

LOGS = Path(__file__).resolve().parents[2] / "data" / "logs"
HINT = "pip install 'specon[plot]'"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if matplotlib were not installed: ``None`` in ``sys.modules`` makes its import fail."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "specon.plots", raising=False)


@pytest.mark.usefixtures("no_matplotlib")
def test_importing_the_plots_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r"'plot' extra"):
        import specon.plots  # noqa: F401, PLC0415


@pytest.mark.usefixtures("no_matplotlib")
def test_classify_plot_names_the_extra(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "replay.png"
    assert main(["classify", "--plot", str(out), str(LOGS / "converging.jsonl")]) == 2
    captured = capsys.readouterr()
    assert HINT in captured.err
    assert captured.out == ""  # it stopped before classifying
    assert not out.exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_classify_without_plot_needs_no_matplotlib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(LOGS / "converging.jsonl")]) == 0
    assert "converged" in capsys.readouterr().out


@pytest.mark.usefixtures("no_matplotlib")
def test_sim_plot_names_the_extra_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No traces at all: the missing extra is reported first, without simulating anything.
    argv = ["sim", "--scenario", "A1", "--traces", str(tmp_path), "--plot", str(tmp_path / "p"), "--quiet"]
    assert main(argv) == 2
    assert HINT in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_demo_names_the_extra_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick", "--out", str(tmp_path / "demo")]) == 2
    assert HINT in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


@pytest.mark.slow
def test_the_daemons_never_load_matplotlib() -> None:
    """Importing the daemons' entry points (and the CLI's) loads no matplotlib."""
    code = (
        "import sys, specon_agent.__main__, specon_manager.__main__, specon.cli.main; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.usefixtures("no_matplotlib")
def test_learn_plot_names_the_extra_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["learn", "--out", str(tmp_path / "w.npz"), "--plot", str(tmp_path / "curve.png"), "--quiet"]
    assert main(argv) == 2
    assert HINT in capsys.readouterr().err
    assert not (tmp_path / "w.npz").exists()
