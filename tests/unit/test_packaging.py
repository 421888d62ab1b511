"""Light installs: what a plain ``pip install specon`` gives, and what the wheel puts in
site-packages."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specon.daemon.cli_args import missing_extra

ROOT = Path(__file__).resolve().parents[2]
# The extras' client libraries: a plain install has none of them.
EXTRAS = ("kubernetes", "docker", "matplotlib", "torch", "tensorboard", "lightning", "transformers", "keras")


def _loaded(code: str) -> set[str]:
    """Top-level names of the modules ``code`` loads into a fresh interpreter (not counting
    what the interpreter's start-up loaded: site hooks such as an editable install's finder)."""
    probe = (
        "import sys\nbefore = set(sys.modules)\n"
        f"{code}\n"
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    return set(out.stdout.split())


@pytest.mark.slow
def test_the_cli_the_simulator_and_the_daemons_on_the_local_runtime_load_no_extra() -> None:
    loaded = _loaded(
        "import specon.cli.main, specon.sim.runner, specon.embedded.demo, specon.runtime.local.backend\n"
        "import specon_agent.__main__, specon_manager.__main__"
    )
    assert not loaded & set(EXTRAS)


def test_the_job_side_imports_the_standard_library_only() -> None:
    loaded = _loaded("import specon.jobkit, specon.checkpoint")
    assert loaded - set(sys.stdlib_module_names) == {"specon"}


def test_a_backend_without_its_extra_names_the_install_line() -> None:
    assert missing_extra("json", "x", "anything") is None
    msg = missing_extra("nope", "kubernetes", "--runtime kubernetes")
    assert msg == "--runtime kubernetes needs the nope client library: pip install 'specon[kubernetes]'"


@pytest.mark.slow
def test_the_wheel_installs_nothing_generic_into_site_packages(tmp_path: Path) -> None:
    """Only ``specon``, ``specon_agent`` and ``specon_manager``: no bare ``agent``, ``manager``,
    ``bench`` or ``tests`` that any other ``agent.py`` would shadow; the console scripts keep
    their names. Built from a copy of the tree: a build in place writes build/ and an egg-info
    into the checkout, which the other test workers import from."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT,
        tree,
        ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"),
    )
    out = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(tree),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("specon-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"specon", "specon_agent", "specon_manager"}
    assert {"specon_agent/__main__.py", "specon_manager/__main__.py", "specon/py.typed"} <= set(names)
    templates = {p.name for p in (ROOT / "specon" / "data" / "systemd").iterdir()}
    assert templates and {f"specon/data/systemd/{t}" for t in templates} <= set(names)
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as z:
        scripts = z.read(entry_points).decode()
    assert "specon-agent = specon_agent.__main__:main" in scripts
    assert "specon-manager = specon_manager.__main__:main" in scripts
    assert "specon = specon.cli.main:main" in scripts
