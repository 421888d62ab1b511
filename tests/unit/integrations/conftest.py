"""Fixtures of the integration tests: the job's environment, and signal handlers put back."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specon import jobkit
from specon.testing.progress_log import progress_records


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The variables a runtime sets for a job, under ``tmp_path``; returns ``tmp_path``."""
    monkeypatch.setenv(jobkit.ENV_PROGRESS_FILE, str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv(jobkit.ENV_CHECKPOINT_DIR, str(tmp_path / "checkpoints"))
    monkeypatch.setenv(jobkit.ENV_JOB_ID, "job-1")
    return tmp_path


@pytest.fixture(autouse=True)
def _signal_handlers() -> Iterator[None]:
    """A test that stops mid-training leaves the handlers as they were."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def records(path: Path) -> list[dict[str, Any]]:
    return progress_records(path)


def events(path: Path) -> list[dict[str, Any]]:
    return [r for r in records(path) if "event" in r]


def sample_steps(path: Path) -> list[int]:
    return [int(r["step"]) for r in records(path) if "loss" in r]
