"""Host failures in the simulator: checkpoints, a lost host's jobs restored by the manager's
reconciler (or restarted from scratch under DS), reclaim notices, and runs that meet none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specon.evaluation import RunResult
from specon.model import WorkerId
from specon.sim.cluster import SimParams, Workload
from specon.sim.failures import Checkpoints, Failures, HostEvent
from specon.sim.policies import make_policy
from specon.sim.runner import _Run, simulate
from specon.testing.builders import job_plan, trace, workload

W1, W2 = WorkerId("w1"), WorkerId("w2")
IDEAL = SimParams()
STEPS, COST = 2000, 0.1  # 200 s alone; a checkpoint every 200 steps = every 20 s
# Detection: recovery.after (60 s; the last heartbeat before a loss at 105 s was at 100 s).
AFTER = 60.0


def _one_job(*events: HostEvent) -> Workload:
    losses = [float(STEPS - i) for i in range(STEPS)]  # still falling: never converged
    wl = workload(2, [job_plan("a", trace(losses), cost=COST, worker="w1")])
    return replace(wl, failures=Failures(events=events), key="test/0")


def _run(wl: Workload, policy: str) -> RunResult:
    return simulate(wl, make_policy(policy), params=IDEAL)


def test_the_last_checkpoint_is_every_n_steps_or_seconds_whichever_comes_first() -> None:
    ck = Checkpoints(every=200, interval=60.0)
    # 10 steps/s: by steps every 20 s; from step 0 at t=0, by t=105 the last one is at 100 s.
    assert ck.last((0.0, 0.0), t0=0.0, s0=0.0, rate=10.0, now=105.0) == pytest.approx((1000.0, 100.0))
    # 1 step/s: by time every 60 s.
    assert ck.last((0.0, 0.0), t0=0.0, s0=0.0, rate=1.0, now=130.0) == pytest.approx((120.0, 120.0))
    # Checkpointed 50 s ago at step 30, running at 1 step/s since t0=40 from step 35: due at 70 s.
    assert ck.last((30.0, 10.0), t0=40.0, s0=35.0, rate=1.0, now=75.0) == pytest.approx((65.0, 70.0))
    assert ck.last((0.0, 0.0), t0=0.0, s0=0.0, rate=10.0, now=19.0) is None
    assert ck.last((0.0, 0.0), t0=0.0, s0=0.0, rate=0.0, now=500.0) is None  # no progress, no save


def test_a_lost_hosts_job_is_restored_from_its_checkpoint_by_the_manager() -> None:
    run = _run(_one_job(HostEvent(W1, 105.0)), "specon")
    lost = run.meta["failures"]
    assert (lost["hosts_lost"], lost["jobs_lost"], lost["recoveries"]) == (1, 1, 1)
    # At 105 s it had trained 1,050 steps, checkpointed at 1,000: it loses at most one interval.
    assert lost["lost_steps"] == pytest.approx(50.0)
    assert 0 < lost["lost_steps"] <= 200
    assert lost["lost_seconds"] == pytest.approx(5.0)
    (m,) = run.migrations
    assert (m.reason, m.source, m.target) == ("recovered", W1, W2)
    assert AFTER + 100 <= m.t <= AFTER + 105 + 5  # found by a heartbeat pass once silent 60 s
    (job,) = run.jobs
    assert [w for _, w in job.worker_history] == [W1, W2]
    restored_at = job.worker_history[1][0]
    assert job.finish == pytest.approx(restored_at + (STEPS - 1000) * COST)


def test_under_ds_a_lost_job_restarts_from_scratch_after_the_same_delay() -> None:
    run = _run(_one_job(HostEvent(W1, 105.0)), "ds")
    lost = run.meta["failures"]
    assert (lost["hosts_lost"], lost["jobs_lost"], lost["recoveries"]) == (1, 1, 1)
    assert lost["lost_steps"] == pytest.approx(1050.0)  # every step it had trained
    (job,) = run.jobs
    assert job.worker_history == ((0.0, W1), (105.0 + AFTER, W2))
    assert job.finish == pytest.approx(105.0 + AFTER + STEPS * COST)
    assert run.migrations == ()


def test_a_reclaim_notice_drains_the_worker_before_its_host_goes() -> None:
    run = _run(_one_job(HostEvent(W1, 105.0, notice=30.0)), "specon")
    lost = run.meta["failures"]
    assert (lost["notices"], lost["hosts_lost"], lost["jobs_lost"], lost["lost_steps"]) == (1, 1, 0, 0)
    (m,) = run.migrations
    assert (m.reason, m.source, m.target, m.t) == ("evacuated", W1, W2, 105.0)
    # DS has no drain: the job is lost at the deadline, with all its steps.
    ds = _run(_one_job(HostEvent(W1, 105.0, notice=30.0)), "ds")
    assert ds.meta["failures"]["lost_steps"] == pytest.approx(1350.0)


@pytest.mark.parametrize("policy", ["ds", "specon", "srpt"])
def test_failures_that_never_strike_change_nothing(policy: str) -> None:
    late = _one_job(HostEvent(W2, 10_000.0))
    quiet = replace(late, failures=None)
    with_failures, without = _run(late, policy), _run(quiet, policy)
    assert with_failures.jobs == without.jobs
    assert with_failures.meta["failures"]["hosts_lost"] == 0
    assert "failures" not in without.meta


def test_every_policy_of_a_seed_meets_the_same_failures() -> None:
    f = Failures(mtbf=100.0)
    a, b = f.clock("A3/0"), f.clock("A3/0")
    assert [a.next_after(W1, t) for t in (0.0, 50.0)] == [b.next_after(W1, t) for t in (0.0, 50.0)]
    assert f.clock("A3/1").next_after(W1, 0.0) != f.clock("A3/0").next_after(W1, 0.0)
    first = {w: f.clock("test/0").next_after(w, 0.0) for w in (W1, W2)}
    expected = sum(t is not None and t <= 60.0 for t in first.values())
    for policy in ("ds", "specon"):
        run = _Run(replace(_one_job(), failures=f), make_policy(policy), IDEAL)
        run.run(60.0)
        assert run.hosts is not None and run.hosts.lost.hosts_lost == expected


def test_a_lost_worker_comes_back_after_repair_and_takes_jobs_again() -> None:
    losses = [float(STEPS - i) for i in range(STEPS)]
    plans = [job_plan("a", trace(losses), cost=COST, worker="w1"),
             job_plan("b", trace(losses), cost=COST, worker="w1", submit=150.0)]  # fmt: skip
    wl = replace(workload(1, plans), failures=Failures(events=(HostEvent(W1, 50.0),), repair=30.0))
    run = _run(wl, "ds")
    a, b = run.jobs
    # Back empty at 80 s: a restarts there at 110 s (the detection delay), b arrives at 150 s.
    assert a.worker_history == ((0.0, W1), (50.0 + AFTER, W1))
    assert b.worker_history == ((150.0, W1),)
    assert a.finish is not None and b.finish is not None


def test_a_run_with_failures_is_the_same_whatever_pythons_hash_seed(tmp_path: Path) -> None:
    # Lost workers' jobs are recovered in one order (sets iterate by the hash seed).
    outs = set()
    for seed in ("1", "2"):
        out = tmp_path / f"{seed}.json"
        argv = [sys.executable, "-m", "specon.cli.main", "sim", "--scenario", "A3", "--mtbf", "7200",
                "--seeds", "4", "--policy", "specon", "--quiet", "--json", str(out)]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(argv, capture_output=True, check=True, env=env, timeout=120)
        result = json.loads(out.read_text())
        result.pop("cpu_seconds")  # the run's own cost, not its result
        outs.add(json.dumps(result, sort_keys=True))
    assert len(outs) == 1
