"""Training the learned rule in the simulator: objectives, explorers, returns, ``learn``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from specon.config import default_policy
from specon.evaluation import JobResult, RunResult
from specon.policy.dl2.features import COUNT
from specon.policy.dl2.network import Network
from specon.sim.dl2.episodes import Greedy, Sampler, Teacher, returns, run, slowdowns
from specon.sim.dl2.objectives import Adam, Decision, actor_critic, entropy, imitation, log_prob
from specon.sim.dl2.train import LearnConfig, cases, header, learn
from specon.sim.trace import load_traces

TINY = LearnConfig(
    scenarios=("A3",),
    train_seeds=(100,),
    validation_seeds=(200,),
    imitation_epochs=2,
    iterations=2,
    episodes=1,
    updates=2,
    validate_every=1,
)


def test_plackett_luce_log_probability_and_its_gradient() -> None:
    s = np.array([0.3, -1.0, 2.0, 0.5])
    lp, g = log_prob(s, [2, 0, 3, 1], top=3)
    e = np.exp(s)
    expected = np.log(e[2] / e.sum()) + np.log(e[0] / (e[0] + e[3] + e[1])) + np.log(e[3] / (e[3] + e[1]))
    assert lp == pytest.approx(expected)
    eps = 1e-6
    for i in range(4):
        d = np.zeros(4)
        d[i] = eps
        num = (log_prob(s + d, [2, 0, 3, 1], 3)[0] - log_prob(s - d, [2, 0, 3, 1], 3)[0]) / (2 * eps)
        assert g[i] == pytest.approx(num, abs=1e-6)
    # Only the first places count: the last is forced, and top=1 scores the first alone.
    assert log_prob(s, [2, 0, 3, 1], top=1)[0] == pytest.approx(np.log(e[2] / e.sum()))


def test_entropy_gradient_matches_finite_differences() -> None:
    s = np.array([0.1, 1.5, -0.7])
    h, g = entropy(s)
    assert 0 < h < np.log(3)
    eps = 1e-6
    for i in range(3):
        d = np.zeros(3)
        d[i] = eps
        assert g[i] == pytest.approx((entropy(s + d)[0] - entropy(s - d)[0]) / (2 * eps), abs=1e-6)


def _decisions(rng: np.random.Generator, count: int) -> list[Decision]:
    """Workers whose teacher runs the job with the least of feature 1 first."""
    out = []
    for k in range(count):
        n = int(rng.integers(2, 6))
        x = rng.normal(size=(n, COUNT))
        out.append(
            Decision(x, tuple(int(i) for i in np.argsort(x[:, 1])), float(k), tuple(map(str, range(n))))
        )
    return out


def test_imitation_learns_a_teacher_it_can_represent() -> None:
    rng = np.random.default_rng(0)
    demos = _decisions(rng, 300)
    net = Network.initial(0)
    opt = Adam(3e-3)
    first, agree0, _ = imitation(net, demos, top=2)
    for _ in range(150):
        _, _, grads = imitation(net, demos, top=2)
        opt.step(net, grads)
    last, agree, _ = imitation(net, demos, top=2)
    assert last < first / 2 and agree > 0.9 > agree0


def test_actor_critic_moves_towards_the_better_action_and_fits_the_return() -> None:
    # One state, two jobs; putting job 0 first returns 1, job 1 first returns 0.
    x = np.array([[1.0] + [0.0] * (COUNT - 1), [0.0] * COUNT])
    decisions = [Decision(x, (0, 1), 0.0, ("a", "b")), Decision(x, (1, 0), 0.0, ("a", "b"))]
    rets = np.array([1.0, 0.0])
    net = Network.initial(2)
    opt = Adam(1e-2)
    before = net.scores(x)
    err0 = actor_critic(net, decisions, rets, top=1, entropy_weight=0.0)[1]
    for _ in range(100):
        grads, _, _ = actor_critic(net, decisions, rets, top=1, entropy_weight=0.0)
        opt.step(net, grads)
    after = net.scores(x)
    assert after[0] - after[1] > before[0] - before[1] + 1.0
    assert actor_critic(net, decisions, rets, top=1, entropy_weight=0.0)[1] < err0


def test_returns_charge_the_time_left_and_slowdown_past_the_free_band() -> None:
    def job(name: str, finish: float) -> JobResult:
        return JobResult(name, "vae", 0.0, finish, 100, 100)

    ds = RunResult((job("a", 100.0), job("b", 100.0)))
    got = RunResult((job("a", 50.0), job("b", 250.0)))
    assert slowdowns(got, ds) == {"a": 0.5, "b": 2.5}
    d = Decision(np.zeros((2, COUNT)), (0, 1), 10.0, ("a", "b"))
    [plain] = returns([d], got, ds, penalty=0.0)
    assert plain == pytest.approx(-((40.0 + 240.0) / 2) / 100.0)
    [charged] = returns([d], got, ds, free=1.5, penalty=1.0)
    assert charged == pytest.approx(plain - (0.0 + 1.0) / 2)


@pytest.mark.slow
def test_explorers_take_and_record_the_rules_decisions() -> None:
    traces = load_traces()
    [case] = cases(("A3",), (100,), traces)
    teacher = Teacher(default_policy().priority)
    taught = run(case.workload, case.policy, teacher)
    assert teacher.decisions and all(len(d.ids) > 1 and d.now >= 0 for d in teacher.decisions)
    assert taught.avg_jct is not None
    sampler = Sampler(Network.initial(0), np.random.default_rng(0), epsilon=0.5)
    sampled = run(case.workload, case.policy, sampler)
    assert sampler.decisions and sampled.avg_jct is not None
    assert sorted(sampler.decisions[0].order) == list(range(len(sampler.decisions[0].ids)))
    # Every job still ends with its steps whoever orders them.
    greedy = run(case.workload, case.policy, Greedy(Network.initial(1)))
    assert {j.id for j in greedy.jobs if j.finish is not None} == {p.id for p in case.workload.jobs}


@pytest.mark.slow
def test_learning_is_reproducible_from_its_seed() -> None:
    traces = load_traces()
    seen: list[str] = []
    a = learn(TINY, traces, seen.append)
    b = learn(TINY, traces)
    for name, value in a.net.params().items():
        assert np.array_equal(getattr(b.net, name), value), name
    assert [p.phase for p in a.curve] == ["imitation"] * 2 + ["rl"] * 3
    assert a.kept == "imitation" or (a.kept in {"rl 1", "rl 2"} and a.worst <= TINY.max_slowdown)
    assert any(s.startswith("imitation epoch 2/2") for s in seen)
    c = learn(replace(TINY, seed=TINY.seed + 1), traces)
    assert not np.array_equal(c.net.w1, a.net.w1)
    h = header(TINY, a)
    assert h["config"]["scenarios"] == ["A3"] and h["kept"] == a.kept  # type: ignore[index]
