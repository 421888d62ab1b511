"""The learned priority rule: its features, networks, weights files and the rule itself."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from specon.model import WEIGHT_MAX, ContainerId
from specon.policy.dl2 import features as feats
from specon.policy.dl2.explore import active, exploring
from specon.policy.dl2.network import FORMAT, Network, WeightsError, load, pool, read, shipped_path
from specon.policy.priority import dl2
from specon.policy.priority.base import JobProgress
from specon.policy.priority.rules import RULES


def _job(
    name: str,
    *,
    started: float = 0.0,
    step: float = 0.0,
    total: int | None = 1000,
    cpu: float = 0.0,
    fair: float = 0.0,
    gain: float | None = None,
) -> JobProgress:
    return JobProgress(
        id=ContainerId(name),
        started=started,
        step=step,
        total=total,
        cpu_seconds=cpu,
        fair_seconds=fair,
        gain=gain,
    )


JOBS = [
    _job("a", started=0, step=100, total=5000, cpu=2.0, fair=3.0, gain=0.2),
    _job("b", started=5, step=900, total=1000, cpu=18.0, fair=20.0, gain=1e-4),
    _job("c", started=9, step=0, total=None, cpu=0.0, fair=1.0),
]


def test_features_have_one_row_per_job_and_one_column_per_name() -> None:
    x = feats.features(JOBS)
    assert x.shape == (3, feats.COUNT) == (3, len(feats.NAMES))
    assert np.isfinite(x).all()
    col = {n: i for i, n in enumerate(feats.NAMES)}
    # c declared no total and has no loss fit: its work is unknown, it ranks last.
    assert list(x[:, col["work_known"]]) == [1.0, 1.0, 0.0]
    assert x[2, col["work_rank"]] == 1.0 and x[1, col["work_rank"]] == 0.0  # b has least left
    assert x[1, col["done"]] == pytest.approx(0.9)
    assert list(x[:, col["gain_known"]]) == [1.0, 1.0, 0.0]
    assert x[0, col["log_gain"]] > x[1, col["log_gain"]]
    assert x[2, col["deficit"]] > 0 > -1  # c had a fair share and used none of it
    assert list(x[:, col["start_rank"]]) == [0.0, 0.5, 1.0]


def test_features_follow_the_jobs_not_their_order() -> None:
    x = feats.features(JOBS)
    y = feats.features([JOBS[2], JOBS[0], JOBS[1]])
    assert np.allclose(y, x[[2, 0, 1]])
    assert feats.features([]).shape == (0, feats.COUNT)


def _numeric(f: object, param: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(param)
    it = np.nditer(param, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = param[i]
        param[i] = old + eps
        up = f()  # type: ignore[operator]
        param[i] = old - eps
        down = f()  # type: ignore[operator]
        param[i] = old
        grad[i] = (up - down) / (2 * eps)
    return grad


def test_actor_and_critic_gradients_match_finite_differences() -> None:
    rng = np.random.default_rng(3)
    net = Network.initial(1, hidden=5)
    x = rng.normal(size=(4, feats.COUNT))
    w = rng.normal(size=4)
    grads = net.actor_grads(x, w)
    for name in ("w1", "b1", "w2", "b2", "w3", "b3"):
        num = _numeric(lambda: float(w @ net.scores(x, exact=True)), getattr(net, name))
        assert np.allclose(grads[name], num, atol=1e-6), name
    pooled = np.stack([pool(x), pool(x[:2])])
    v = rng.normal(size=2)
    cgrads = net.critic_grads(pooled, v)
    for name in ("c1", "d1", "c2", "d2"):
        num = _numeric(lambda: float(v @ net.values(pooled)), getattr(net, name))
        assert np.allclose(cgrads[name], num, atol=1e-6), name


def test_a_weights_file_reads_back_the_same_network(tmp_path: Path) -> None:
    net = Network.initial(7)
    path = tmp_path / "w.npz"
    net.save(path, kept="test")
    got, header = read(path)
    assert header["format"] == FORMAT and header["kept"] == "test"
    for name, value in net.params().items():
        assert np.array_equal(getattr(got, name), value)
    x = feats.features(JOBS)
    assert np.array_equal(load(str(path)).scores(x), net.scores(x))


def test_a_file_that_is_not_a_weights_file_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(WeightsError, match="not a dl2 weights file"):
        read(junk)
    with pytest.raises(WeightsError, match="No such file"):
        load(str(tmp_path / "missing.npz"))
    other = tmp_path / "other.npz"
    params = Network.initial(0).params()
    np.savez(other, header=np.array(json.dumps({"format": FORMAT, "features": ["x"]})), **params)
    with pytest.raises(WeightsError, match="other features"):
        read(other)
    old = tmp_path / "old.npz"
    np.savez(
        old, header=np.array(json.dumps({"format": "specon-dl2/0", "features": list(feats.NAMES)})), **params
    )
    with pytest.raises(WeightsError, match="format"):
        read(old)
    bad = tmp_path / "bad.npz"
    params["w2"] = np.zeros((3, 3))
    np.savez(bad, header=np.array(json.dumps({"format": FORMAT, "features": list(feats.NAMES)})), **params)
    with pytest.raises(WeightsError, match="w2 has shape"):
        read(bad)


def test_the_shipped_weights_load_and_are_small() -> None:
    path = shipped_path()
    net, header = read(path)
    assert header["format"] == FORMAT
    assert path.stat().st_size < 300_000
    assert np.isfinite(net.scores(feats.features(JOBS))).all()


def test_the_rule_is_registered_and_checks_its_weights_file(tmp_path: Path) -> None:
    rule = RULES["dl2"]
    assert rule.peer is False  # its experiment is the default with this order
    assert rule.problems(dl2.Args()) == []
    assert rule.problems(dl2.Args(ratio=0.5)) == ["ratio: must be >= 1, got 0.5"]
    [problem] = rule.problems(dl2.Args(weights=str(tmp_path / "none.npz")))
    assert problem.startswith("weights: ")


def test_the_rule_ranks_by_score_with_near_strict_weights(tmp_path: Path) -> None:
    net = Network.initial(0)
    # A network that scores a job by how little work it has left (minus work_known's rank).
    net.w1[:] = 0.0
    net.w1[feats.NAMES.index("work_rank"), 0] = -1.0
    net.w2[:] = 0.0
    net.w2[0, 0] = 1.0
    net.w3[:] = 0.0
    net.w3[0, 0] = 1.0
    path = tmp_path / "srpt-like.npz"
    net.save(path)
    got = dl2.weights(JOBS, dl2.Args(weights=str(path)))
    assert list(got) == ["b", "a", "c"] and got[ContainerId("b")] == WEIGHT_MAX
    assert dl2.weights([], dl2.Args(weights=str(path))) == {}
    # c has had none of its fair share: the guard puts it first whatever the network says.
    assert list(dl2.weights(JOBS, dl2.Args(weights=str(path), min_share=0.5))) == ["c", "b", "a"]


def test_the_guard_puts_starved_jobs_first_most_starved_first() -> None:
    jobs = [
        _job("fed", cpu=10.0, fair=10.0),
        _job("half", cpu=4.0, fair=10.0),
        _job("none", cpu=0.0, fair=10.0),
        _job("new", cpu=0.0, fair=0.0),  # no fair share yet: nothing owed
    ]
    assert dl2.guarded(jobs, [0, 3, 1, 2], 0.5) == ["none", "half", "fed", "new"]
    assert dl2.guarded(jobs, [0, 3, 1, 2], 0.0) == ["fed", "new", "half", "none"]
    assert RULES["dl2"].problems(dl2.Args(min_share=1.5)) == ["min_share: must be in [0, 1], got 1.5"]


def test_ties_go_to_the_job_started_first() -> None:
    jobs = [_job("late", started=9), _job("early", started=1), _job("mid", started=5)]
    assert dl2.greedy(jobs, np.zeros(3)) == [1, 2, 0]


class _Reverse:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def decide(self, jobs: Sequence[JobProgress], x: np.ndarray) -> Sequence[int]:
        self.seen.append(len(x))
        return list(range(len(jobs)))[::-1]


def test_an_active_explorer_takes_the_decisions_within_its_block() -> None:
    ex = _Reverse()
    assert active() is None
    with exploring(ex):
        assert active() is ex
        got = dl2.weights(JOBS, dl2.Args())
    assert active() is None
    assert list(got) == ["c", "b", "a"] and ex.seen == [3]


def test_the_remaining_work_feature_is_srpts() -> None:
    from specon.policy.priority.srpt import remaining_work  # noqa: PLC0415

    rng = np.random.default_rng(5)
    jobs = [
        JobProgress(
            id=ContainerId(f"j{i}"),
            started=float(i),
            step=float(rng.integers(0, 500)),
            total=None if i % 4 == 0 else int(rng.integers(100, 2000)),
            cpu_seconds=0.0 if i % 3 == 0 else float(rng.uniform(0, 50)),
            predicted_steps=None if i % 8 == 0 else float(rng.uniform(0, 900)),
            cost=None if i % 2 else float(rng.uniform(0.01, 0.1)),
            measured=i % 5 == 0,
        )
        for i in range(40)
    ]
    for group in (jobs, jobs[:1], [j for j in jobs if j.cost is None and j.cpu_seconds == 0]):
        x = feats.features(group)
        work = remaining_work(group)
        col = feats.NAMES.index("log_work")
        for row, j in zip(x, group, strict=True):
            w = work[j.id]
            assert row[0] == (w is not None)
            assert row[col] == pytest.approx(0.0 if w is None else np.log1p(max(w, 0.0)) / 10.0)
