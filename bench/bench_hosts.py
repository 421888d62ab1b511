"""Move downtime across network hosts against the same move on one host (local runtime).

The end-to-end scenario of ``tests/integration/test_e2e_local.py``, run to its move: an
embedded cluster (real manager and agent processes, two 0.5-CPU workers) gets a job that
converges in seconds and a steady one on ``w0``; the manager moves the converged job to
``w1`` by save/restore. Three set-ups, interleaved round by round, the same command each:

* one host, loopback HTTP - manager on 127.0.0.1, agents on 127.0.0.2 and .3;
* one host, loopback TLS - the same, the manager serving HTTPS (the agents verify it);
* three network hosts, TLS - manager and agents each in a network namespace of their own on
  a test bridge (``specon.testing.net_hosts``, 198.51.100.0/24), as across machines.

Per move: the manager's ``downtime`` of the migration in ``/v1/status`` (from the SIGTERM on the
source, back-dated by the save's length its agent reports, until the target's start result
reaches the manager, on the manager's clock), and the job's own gap in its progress log (its
last training sample on the source until its first on the target: restore start-up included).
Medians of 5 (2 with ``--quick``). A move that fails or does not end in 120 s is counted (a
figure, target 0), its daemons' logs kept in ``bench/results/bench_hosts-failed/``, and the
rounds go on; the medians are over the moves that were made.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench._proc import quiet_logs
from bench.figures import Figure
from specon.coordinator.migration import State
from specon.embedded.cluster import EmbeddedCluster
from specon.model import WorkerId
from specon.testing.certs import manager_tls
from specon.testing.net_hosts import NetHost, NetHosts
from specon.wire.status import MigrationStatus
from tests.integration.test_e2e_local import POLICY, job, records, wait_for

LOOPBACK = "one host, loopback HTTP"
LOOPBACK_TLS = "one host, loopback TLS"
HOSTS = "three network hosts, TLS"
SETUPS = (LOOPBACK, LOOPBACK_TLS, HOSTS)
W0 = WorkerId("w0")
FAILED_LOGS = Path(__file__).resolve().parent / "results" / "bench_hosts-failed"
MOVE_TIMEOUT = 120.0


class MoveFailedError(RuntimeError):
    """The move failed, or did not end in time; the message says how far it got."""


@dataclass(frozen=True, slots=True)
class Move:
    downtime: float  # the manager's
    gap: float  # the job's


def _gap(recs: list[dict[str, object]]) -> float | None:
    """Last training sample before the ``checkpointed`` record to the first one after the
    resumed ``started``; None until the job trains again on the target."""
    events = [r.get("event") for r in recs]
    if "checkpointed" not in events:
        return None
    cut = events.index("checkpointed")
    before = [r for r in recs[:cut] if "loss" in r]
    resumed = next((i for i in range(cut, len(recs)) if recs[i].get("event") == "started"), None)
    after = [r for r in recs[resumed:] if "loss" in r] if resumed is not None else []
    if not before or not after:
        return None
    return float(after[0]["ts"]) - float(before[-1]["ts"])  # type: ignore[arg-type]


async def _move(setup: str, root: Path) -> Move:
    root.mkdir(parents=True)
    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    with contextlib.ExitStack() as stack:
        hosts: list[NetHost] | None = None
        tls = None
        if setup == HOSTS:
            net = stack.enter_context(NetHosts(3))
            hosts = list(net)
            tls = manager_tls(root, net[0].address)
        elif setup == LOOPBACK_TLS:
            tls = manager_tls(root, "127.0.0.1")
        async with EmbeddedCluster(
            root / "c", workers=2, cpus_per_worker=0.5, policy=policy, hosts=hosts, tls=tls
        ) as c:
            await c.submit(job("fast", 400, "converge"), W0)
            await c.submit(job("steady", 500, "linear"), W0)
            try:
                done = await _moved(c)
                await wait_for(lambda: _gap(records(c, "fast")) is not None, "the job training again")
            except (AssertionError, MoveFailedError) as exc:
                shutil.rmtree(FAILED_LOGS / root.name, ignore_errors=True)
                shutil.copytree(c.logs, FAILED_LOGS / root.name)
                raise MoveFailedError(f"{exc}; logs in {FAILED_LOGS / root.name}") from exc
            gap = _gap(records(c, "fast"))
            assert done.downtime is not None and gap is not None
            return Move(done.downtime, gap)
    raise AssertionError("unreachable")


async def _moved(c: EmbeddedCluster) -> MigrationStatus:
    """The converged job's migration once done; ``MoveFailedError`` if it ends otherwise or
    does not end in ``MOVE_TIMEOUT`` s."""
    seen: list[MigrationStatus] = []

    async def ended() -> bool:
        seen[:] = [m for m in (await c.status()).migrations if m.container == "fast"]
        return any(m.state.terminal for m in seen)  # done, or rolled back

    def states() -> list[tuple[str, str | None]]:
        return [(m.state.value, m.error) for m in seen]

    try:
        await wait_for(ended, "the move", timeout=MOVE_TIMEOUT)
    except AssertionError:
        raise MoveFailedError(f"no move ended in {MOVE_TIMEOUT:g}s: {states()}") from None
    done = next((m for m in seen if m.state is State.DONE), None)
    if done is None:
        raise MoveFailedError(f"the move ended {states()}")
    return done


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}s ({min(values):.2f}-{max(values):.2f}), n={len(values)}"


def run(quick: bool) -> list[Figure]:
    rounds = 2 if quick else 5
    moves: dict[str, list[Move]] = {s: [] for s in SETUPS}
    failed: list[str] = []
    with quiet_logs(), tempfile.TemporaryDirectory(prefix="specon-bench-hosts-") as tmp:
        for i in range(rounds):  # interleaved: a drift of the machine's load hits every set-up alike
            for setup in SETUPS:
                label = f"round {i + 1}/{rounds}, {setup}"
                try:
                    m = asyncio.run(_move(setup, Path(tmp) / f"{i}-{SETUPS.index(setup)}"))
                except MoveFailedError as exc:
                    print(f"  ... {label}: FAILED: {exc}", flush=True)
                    failed.append(f"{label}: {exc}")
                    continue
                print(f"  ... {label}: downtime {m.downtime:.2f}s, gap {m.gap:.2f}s", flush=True)
                moves[setup].append(m)
    if any(not moves[s] for s in SETUPS):
        raise MoveFailedError(f"no move made in some set-up: {failed}")
    figures = [Figure("moves that failed", len(failed), "moves", 0, "max", "; ".join(failed))]
    for setup in SETUPS:
        down = [m.downtime for m in moves[setup]]
        gaps = [m.gap for m in moves[setup]]
        figures.append(Figure(f"move downtime (manager), {setup}", statistics.median(down), "s",
                              detail=_spread(down)))  # fmt: skip
        figures.append(Figure(f"move gap (job's log), {setup}", statistics.median(gaps), "s",
                              detail=_spread(gaps)))  # fmt: skip
    median = {s: statistics.median(m.downtime for m in moves[s]) for s in SETUPS}
    figures.append(
        Figure(
            "move downtime, three hosts minus one host (HTTP)",
            median[HOSTS] - median[LOOPBACK],
            "s",
            detail=f"minus one host (TLS): {median[HOSTS] - median[LOOPBACK_TLS]:+.2f}s",
        )
    )
    return figures
