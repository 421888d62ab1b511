"""What the learned rule sees of each job: a row of numbers per job, from ``JobProgress``.

Every feature is what an agent knows without the simulator (declared or predicted steps,
CPU used and its fair share, Algorithm 1's gain), scaled to about [-1, 1], and most are
relative to the worker's other jobs, so one network serves a worker of 2 jobs and one of
1,000. Changing the list changes what a weights file means: ``NAMES`` is stored in the file
and checked when it is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from specon.policy.priority.base import JobProgress

Matrix = npt.NDArray[np.float64]

NAMES: tuple[str, ...] = (
    "work_known",  # 1 where the remaining work is known (declared or predicted steps)
    "log_work",  # log(1 + remaining CPU-seconds) / 10
    "rel_work",  # log of remaining work over the worker's median, / 3
    "work_rank",  # rank by remaining work, 0 (least) .. 1 (most or unknown)
    "done",  # fraction of the declared steps trained (0 where none declared)
    "log_attained",  # log(1 + CPU-seconds used) / 10
    "rel_attained",  # log of CPU used over the worker's mean, / 3
    "deficit",  # (fair share - CPU used) / (fair share + 1): how far behind an equal share
    "gain_known",  # 1 where Algorithm 1 has classified the job
    "log_gain",  # log10 of its last normalised gain (1e-6 .. 1) / 6
    "log_jobs",  # log(jobs on the worker) / 5
    "start_rank",  # rank by start time, 0 (first started) .. 1 (last)
)
COUNT = len(NAMES)


def _ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """0 .. 1 by ascending value (ties broken by position), 0 for a single value."""
    n = len(values)
    out = np.empty(n)
    out[np.argsort(values, kind="stable")] = np.arange(n)
    return out / max(1, n - 1)


def _work(left: Matrix, cost: Matrix) -> Matrix:
    """CPU-seconds each job still needs (NaN: unknown): ``srpt.remaining_work`` over arrays
    (steps left x the job's CPU per step, else its neighbours' median, else the steps left
    alone), which a worker of 1,000 jobs needs within the decision's 3 ms; a test holds
    the two equal."""
    known = ~np.isnan(cost)
    typical = float(np.median(cost[known])) if known.any() else np.nan
    per_step = np.where(known, cost, typical)
    return np.where(np.isnan(per_step), left, left * per_step)


def features(jobs: Sequence[JobProgress]) -> Matrix:
    """One row of ``NAMES`` per job, in ``jobs``' order."""
    n = len(jobs)
    if n == 0:
        return np.zeros((0, COUNT))
    nan = np.nan
    raw = np.array(
        [
            (
                j.step,
                nan if j.total is None else j.total,
                nan if j.predicted_steps is None else j.predicted_steps,
                j.cpu_seconds,
                j.fair_seconds,
                nan if j.gain is None else j.gain,
                j.started,
                nan if j.cost is None else j.cost,
                j.measured,
            )
            for j in jobs
        ],
        dtype=np.float64,
    )
    step, total, predicted, cpu, fair, gain, started, cost, measured = raw.T
    # ``JobProgress.cpu_per_step``: the cost, else (where the agent does not measure it) CPU
    # over steps once both exist.
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.where(np.isnan(cost) & (measured == 0) & (step > 0) & (cpu > 0), cpu / step, cost)
    has_total = ~np.isnan(total)
    left = np.where(has_total, np.maximum(0.0, total - step), predicted)
    work = _work(left, cost)
    known = ~np.isnan(work)
    log_work = np.log1p(np.where(known, np.maximum(work, 0.0), 0.0))
    median = float(np.median(log_work[known])) if known.any() else 0.0
    rank_key = np.where(known, log_work, np.inf)
    cpu = np.maximum(cpu, 0.0)
    fair = np.maximum(fair, 0.0)
    log_cpu = np.log1p(cpu)
    with np.errstate(divide="ignore", invalid="ignore"):
        done = np.where(has_total & (total > 0), np.clip(step / total, 0.0, 1.0), 0.0)
    gain_known = ~np.isnan(gain)
    log_gain = np.log10(np.clip(np.where(gain_known, gain, 1.0), 1e-6, 1.0)) / 6.0
    out = np.empty((n, COUNT))
    out[:, 0] = known
    out[:, 1] = log_work / 10.0
    out[:, 2] = np.where(known, (log_work - median) / 3.0, 0.0)
    out[:, 3] = _ranks(rank_key)
    out[:, 4] = done
    out[:, 5] = log_cpu / 10.0
    out[:, 6] = (log_cpu - float(np.mean(log_cpu))) / 3.0
    out[:, 7] = np.clip((fair - cpu) / (fair + 1.0), -1.0, 1.0)
    out[:, 8] = gain_known
    out[:, 9] = np.where(gain_known, log_gain, 0.0)
    out[:, 10] = np.log(n) / 5.0
    out[:, 11] = _ranks(started)
    return out
