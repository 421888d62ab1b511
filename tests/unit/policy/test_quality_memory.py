"""The cluster's quality memory: each finished job counted once, the newest kept per model, no
worker holding more than its part, a bounded number of models of bounded names, and its
journal text read back exactly."""

from __future__ import annotations

import pytest

from specon.policy import quality_memory
from specon.policy.quality_memory import MODEL_CHARS, MODELS, PER_MODEL, PER_WORKER, SEEN, QualityMemory


def _with(memory: QualityMemory, model: str, job: str, share: float, worker: str = "w") -> QualityMemory:
    got = memory.finished(model, job, share, worker)
    assert got is not None
    return got


def _spread(memory: QualityMemory, model: str, n: int, share: float, prefix: str = "j") -> QualityMemory:
    """``n`` jobs of ``model`` finished, one worker each."""
    for i in range(n):
        memory = _with(memory, model, f"{prefix}{i}", share, f"w{i}")
    return memory


def test_each_job_counts_once_and_the_median_of_the_newest_is_recalled() -> None:
    mem = QualityMemory()
    for i, share in enumerate((0.2, 0.3, 0.9)):
        mem = _with(mem, "gru", f"j{i}", share, f"w{i}")
    assert mem.version == 3 and mem.shares() == {"gru": 0.3}
    assert mem.finished("gru", "j1", 0.9, "w1") is None  # reported again by a later heartbeat
    shares = mem.shares()
    assert quality_memory.recall(shares, "gru") == 0.3
    assert quality_memory.recall(shares, "vae") is None and quality_memory.recall(shares, None) is None
    mem = _spread(mem, "gru", PER_MODEL, 0.5, prefix="k")
    assert [s for _, _, s in mem.jobs["gru"]] == [0.5] * PER_MODEL  # the oldest forgotten
    assert mem.finished("gru", "j1", 0.9, "w1") is None  # out of the window, still counted


def test_one_worker_holds_at_most_its_part_of_a_model() -> None:
    mem = _spread(QualityMemory(), "gru", 8, 0.3)
    for i in range(PER_MODEL):  # one worker reports many: only its newest PER_WORKER stay
        mem = _with(mem, "gru", f"x{i}", 1.0, "liar")
    assert sum(s == 1.0 for _, _, s in mem.jobs["gru"]) == PER_WORKER
    assert mem.shares()["gru"] == 0.3  # the other workers' jobs still decide the median


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), float("inf")])
def test_a_share_outside_zero_to_one_is_not_remembered(share: float) -> None:
    assert QualityMemory().finished("gru", "j", share, "w") is None


@pytest.mark.parametrize("model", ["", "x" * (MODEL_CHARS + 1), "gru\n", "a\x00b"])
def test_a_model_name_too_long_or_not_printable_is_not_remembered(model: str) -> None:
    assert not quality_memory.model_ok(model)
    assert QualityMemory().finished(model, "j", 0.5, "w") is None
    assert quality_memory.model_ok("x" * MODEL_CHARS) and quality_memory.model_ok("bert-large/v2 ü")


def test_a_flood_of_new_models_cannot_push_out_the_ones_the_cluster_learned() -> None:
    mem = _spread(QualityMemory(), "gru", 3, 0.4)
    for i in range(MODELS - 1):
        mem = _with(mem, f"m{i}", f"m{i}-j", 0.4)
    mem = _with(mem, "m0", "again", 0.4, "w9")  # m0 has two now; m1 is the oldest of the singles
    for i in range(3 * MODELS):  # one-job models, one after another
        mem = _with(mem, f"fake{i}", f"fake{i}-j", 0.0)
    assert len(mem.jobs) == MODELS and {"gru", "m0"} <= mem.jobs.keys() and "m1" not in mem.jobs


def test_the_journal_text_reads_back_exactly_is_small_and_refuses_what_it_did_not_write() -> None:
    mem = _with(_with(QualityMemory(), "gru", "a", 0.25), "vae", "b", 0.5)
    assert QualityMemory.from_text(mem.to_text()) == mem
    assert QualityMemory.from_text(None) == QualityMemory()
    bad_share, bad_version = (
        '{"version": 1, "jobs": {"gru": [["a", "w", 2.0]]}}',
        '{"version": -1, "jobs": {}}',
    )
    for bad in ("[]", "{", bad_share, bad_version):
        with pytest.raises(ValueError, match="unreadable quality memory"):
            QualityMemory.from_text(bad)
    full = QualityMemory()
    long_id = "j" * 253
    for m in range(MODELS):  # the largest memory: every model at its longest, four-byte characters
        model = chr(0x1F600 + m) * MODEL_CHARS
        for i in range(PER_MODEL):
            full = _with(full, model, f"{long_id}{m}-{i}", 0.5, f"{'w' * 253}{i}")
    assert len(full.seen) == SEEN
    assert len(full.to_text().encode()) < 150 * 1024  # well inside a ConfigMap's 1 MiB
