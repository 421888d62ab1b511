"""Timing records to service times and throughput, on synthetic records of known times."""

from __future__ import annotations

from typing import Any

import pytest

from specon.sim.asgd.mva import throughput
from specon.workloads.asgd.profile import (
    ProfileError,
    measured_throughput,
    relative_error,
    service_times,
    spread,
)

W, U, S, D = 0.050, 0.100, 0.010, 0.120  # the run's true service times


def one_worker(
    n: int, *, jitter: float = 0.0, worker: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Records of ``n`` mini-batches of a one-worker run with service times W, U, S, D."""
    ps: list[dict[str, Any]] = [{"event": "hello", "worker": worker, "t": 99.0}]
    wk: list[dict[str, Any]] = []
    t = 100.0  # the first parameters fully in
    for seq in range(n):
        w = W + (jitter if seq % 2 else -jitter)
        compute_end = t + w
        recv_end = compute_end + U
        apply_end = recv_end + S
        wk.append(
            {
                "event": "minibatch",
                "worker": worker,
                "seq": seq,
                "recv_start": t - 0.01,
                "recv_end": t,
                "compute_end": compute_end,
                "send_end": compute_end + 0.001,
            }
        )
        ps.append(
            {
                "event": "update",
                "worker": worker,
                "seq": seq,
                "recv_start": recv_end - 0.09,
                "recv_end": recv_end,
                "apply_start": recv_end + 0.001,
                "apply_end": apply_end,
            }
        )
        t = apply_end + D
    wk.append({"event": "minibatch", "worker": worker, "seq": n, "recv_end": t, "compute_end": t + W})
    return ps, wk


def test_the_four_service_times_are_measured() -> None:
    ps, wk = one_worker(20, jitter=0.005)
    prof = service_times(ps, wk, skip=3)
    assert prof.samples == 17
    t = prof.times
    assert (t.worker, t.uplink, t.server, t.downlink) == pytest.approx((W, U, S, D), abs=1e-3)
    assert prof.stdev["worker"] == pytest.approx(0.005, rel=0.1)
    assert prof.stdev["uplink"] == pytest.approx(0.0, abs=1e-9)


def test_the_warm_up_is_left_out() -> None:
    ps, wk = one_worker(10)
    for r in wk[:2]:
        r["compute_end"] += 1.0  # slow first mini-batches (and their uplink looks negative: skipped)
    assert service_times(ps, wk, skip=2).times.worker == pytest.approx(W)
    with pytest.raises(ProfileError, match="stamps out of order"):
        service_times(ps, wk, skip=1)


def test_the_profile_gives_back_the_one_worker_throughput() -> None:
    """The four times tile the cycle: the model with one worker is the measured rate."""
    ps, wk = one_worker(30)
    prof = service_times(ps, wk)
    rate = measured_throughput(ps, warmup=0.0)
    assert throughput(prof.times, 1, "exact") == pytest.approx(rate.throughput, rel=1e-6)
    assert rate.throughput == pytest.approx(1 / (W + U + S + D))


def test_a_profile_needs_one_worker_and_enough_records() -> None:
    ps, wk = one_worker(10)
    ps2, wk2 = one_worker(10, worker=1)
    with pytest.raises(ProfileError, match="one-worker run"):
        service_times(ps + ps2, wk + wk2)
    with pytest.raises(ProfileError, match="run the one-worker profile longer"):
        service_times(*one_worker(4), skip=3)
    with pytest.raises(ProfileError, match="no number 'recv_end'"):
        service_times(ps, [{**r, "recv_end": None} for r in wk])


def test_the_throughput_window_starts_after_the_clock_and_warm_up() -> None:
    # Updates every 0.5 s from t=0, then every 0.25 s from t=10 (all workers in at t=10).
    ends = [i * 0.5 for i in range(20)] + [10 + i * 0.25 for i in range(1, 41)]
    ps = [{"event": "clock", "t": 10.0}] + [{"event": "update", "apply_end": t} for t in ends]
    rate = measured_throughput(ps, warmup=1.0)
    assert rate.throughput == pytest.approx(4.0)
    assert rate.updates == 37 and rate.window == pytest.approx(9.0)
    with pytest.raises(ProfileError, match="run longer"):
        measured_throughput(ps, warmup=100.0)
    with pytest.raises(ProfileError, match="no update applied"):
        measured_throughput([{"event": "clock", "t": 1.0}], warmup=0)


def test_errors_summarise_like_table_ii() -> None:
    assert relative_error(9.0, 10.0) == pytest.approx(0.1)
    assert relative_error(11.0, 10.0) == pytest.approx(0.1)
    assert spread([0.1, 0.02, 0.06]) == pytest.approx((0.1, 0.06, 0.02))
    with pytest.raises(ProfileError):
        relative_error(1.0, 0.0)
    with pytest.raises(ProfileError):
        spread([])
