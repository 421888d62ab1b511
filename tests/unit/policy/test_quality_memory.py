"""The cluster's quality memory: each finished job counted once, the newest kept per model, a
bounded number of models, and its journal text read back exactly."""

from __future__ import annotations

import pytest

from specon.policy import quality_memory
from specon.policy.quality_memory import MODELS, PER_MODEL, QualityMemory


def _with(memory: QualityMemory, model: str, job: str, share: float) -> QualityMemory:
    got = memory.finished(model, job, share)
    assert got is not None
    return got


def test_each_job_counts_once_and_the_median_of_the_newest_is_recalled() -> None:
    mem = QualityMemory()
    for i, share in enumerate((0.2, 0.3, 0.9)):
        mem = _with(mem, "gru", f"j{i}", share)
    assert mem.version == 3 and mem.shares() == {"gru": 0.3}
    assert mem.finished("gru", "j1", 0.9) is None  # reported again by a later heartbeat
    assert quality_memory.recall(mem.shares(), "gru") == 0.3
    assert (
        quality_memory.recall(mem.shares(), "vae") is None
        and quality_memory.recall(mem.shares(), None) is None
    )
    for i in range(PER_MODEL):
        mem = _with(mem, "gru", f"k{i}", 0.5)
    assert [s for _, s in mem.jobs["gru"]] == [0.5] * PER_MODEL  # the oldest forgotten


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), float("inf")])
def test_a_share_outside_zero_to_one_is_not_remembered(share: float) -> None:
    assert QualityMemory().finished("gru", "j", share) is None


def test_the_least_recently_finished_model_is_forgotten_past_the_bound() -> None:
    mem = QualityMemory()
    for i in range(MODELS):
        mem = _with(mem, f"m{i}", "j", 0.4)
    mem = _with(mem, "m0", "again", 0.4)  # m0 finished a job again: m1 is now the oldest
    mem = _with(mem, "new", "j", 0.4)
    assert len(mem.jobs) == MODELS and "m1" not in mem.jobs and {"m0", "new"} <= mem.jobs.keys()


def test_the_journal_text_reads_back_exactly_and_refuses_what_it_did_not_write() -> None:
    mem = _with(_with(QualityMemory(), "gru", "a", 0.25), "vae", "b", 0.5)
    assert QualityMemory.from_text(mem.to_text()) == mem
    assert QualityMemory.from_text(None) == QualityMemory()
    for bad in ("[]", "{", '{"version": 1, "jobs": {"gru": [["a", 2.0]]}}', '{"version": -1, "jobs": {}}'):
        with pytest.raises(ValueError, match="unreadable quality memory"):
            QualityMemory.from_text(bad)
