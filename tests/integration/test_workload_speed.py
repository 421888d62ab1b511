"""``python -m specon.workloads.speed``: real training steps timed, one JSON object out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_it_times_real_steps_of_each_model_asked() -> None:
    argv = [sys.executable, "-m", "specon.workloads.speed", "--models", "gru,vae", "--steps", "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=True)
    got = json.loads(done.stdout)
    assert set(got) == {"gru", "vae"}
    assert all(isinstance(v, float) and v > 0 for v in got.values()), got


def test_an_unknown_model_is_a_usage_error() -> None:
    argv = [sys.executable, "-m", "specon.workloads.speed", "--models", "gru,nope"]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=240)
    assert done.returncode == 2
    assert "unknown model(s): nope" in done.stderr
