"""The manager under a day-to-day load: 1,000 agents at one heartbeat a second for 60 s.

The real ``python -m specon_manager`` pinned to one core; the load generator
(``bench/_heartbeat_load.py``, pinned to the other core) plays 1,000 agents with 8
containers each, every agent once a second, open loop: a beat is sent when it is due
whether or not earlier ones were answered, and its latency counts from that moment. A
beat not answered 200 (refused, timed out after 30 s, connection error) counts as dropped.

Migrations go on throughout: a tenth of the agents report their converged containers as
asking to move, so Algorithm 2 decides moves, the journal is written (in the manager's
writer thread) and saves are queued. The simulated agents do not carry saves out, so each
migration rolls back at its save deadline (10 s in this bench's policy) and the request
is decided again: a steady stream of decisions, journal writes and rollbacks.

Memory: the manager's RSS before the load, right after it, and once every worker has
been pruned (the load stops; this policy forgets a worker after 2 x 5 s of silence).

Targets: p99 latency < 50 ms and no beat dropped; RSS after pruning within 20 MiB of the
idle RSS (flat: the manager keeps nothing for forgotten workers but the journal's
records, on disk).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from bench._proc import rss_bytes
from bench.bench_daemons import CONTAINERS_PER_AGENT, _cores, _load, _manager, say
from bench.figures import Figure
from specon.wire import protocol

AGENTS = {False: 1_000, True: 200}
DURATION = {False: 60.0, True: 15.0}
REQUESTING = 0.1  # share of agents whose converged containers ask to move
P99_TARGET_MS = 50.0
RSS_GROWTH_TARGET_MIB = 20.0
POLICY = """\
apiVersion: specon/v1alpha1
kind: Policy
messaging: {heartbeat_interval: 1, worker_timeout: 5, prune_after: 2}
migration: {grace_period: 5, save_timeout: 10, restore_timeout: 10}
"""


def _status_total_workers(url: str, token: str) -> int | None:
    req = urllib.request.Request(
        url + protocol.STATUS_PATH + "?limit=1", headers={protocol.AUTH_HEADER: f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(json.loads(r.read())["total_workers"])
    except (OSError, ValueError, KeyError):
        return None


def _journal_states(db: Path) -> Counter[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
        rows = con.execute("SELECT state, COUNT(*) FROM migrations GROUP BY state").fetchall()
    return Counter({str(state): int(n) for state, n in rows})


def run(quick: bool) -> list[Figure]:
    agents, duration = AGENTS[quick], DURATION[quick]
    mcpu, lcpu, cores = _cores()
    with tempfile.TemporaryDirectory(prefix="specon-bench-load-") as tmp:
        root = Path(tmp)
        token_file = root / "token"
        token = secrets.token_urlsafe(24)
        token_file.write_text(token)
        token_file.chmod(0o600)
        say(f"{agents:,} agents x {CONTAINERS_PER_AGENT} containers at 1 beat/s for {duration:g} s; {cores}")
        with _manager(root / "m", token_file, POLICY, mcpu) as mgr:
            rss_idle = rss_bytes(mgr.proc.pid) or 0
            res = _load(
                mgr,
                name="steady",
                agents=agents,
                duration=duration,
                cpu=lcpu,
                rate=float(agents),  # each agent once a second
                extra=("--requesting", str(REQUESTING)),
            )
            rss_after = rss_bytes(mgr.proc.pid) or 0
            states = _journal_states(mgr.dir / "state" / "journal.db")
            say("load stopped; waiting for the manager to forget every worker")
            # Workers a migration in flight names are kept (it must restart its job when one
            # comes back): wait until the count is 0 or has not moved for 10 s.
            t0 = last_change = time.monotonic()
            left = _status_total_workers(mgr.url, token)
            while left and time.monotonic() - last_change < 10.0 and time.monotonic() - t0 < 90:
                time.sleep(1.0)
                now_left = _status_total_workers(mgr.url, token)
                if now_left != left:
                    left, last_change = now_left, time.monotonic()
            forgotten_after = last_change - t0
            rss_pruned = rss_bytes(mgr.proc.pid) or 0
    sent = int(res["ok"]) + sum(res["errors"].values())
    dropped = sum(res["errors"].values())
    mib = 1 << 20
    growth = (rss_pruned - rss_idle) / mib
    return [
        Figure(
            f"heartbeats dropped, {agents:,} agents at 1/s for {duration:g} s",
            float(dropped),
            "beats",
            target=0.0,
            better="max",
            detail=f"{sent:,} sent, {res['ok']:,} answered 200; errors {dict(res['errors']) or 'none'}",
        ),
        Figure("heartbeat latency p50 at 1 beat/s/agent", float(res["p50_ms"]), "ms", better="max"),
        Figure(
            "heartbeat latency p99 at 1 beat/s/agent",
            float(res["p99_ms"]),
            "ms",
            target=P99_TARGET_MS,
            better="max",
            detail=f"p90 {res['p90_ms']:.1f} ms, max {res['max_ms']:.1f} ms",
        ),
        Figure(
            "migrations journaled during the load",
            float(sum(states.values())),
            "",
            better="min",
            detail=", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "none",
        ),
        Figure(
            "manager RSS after the load",
            rss_after / mib,
            "MiB",
            better="max",
            detail=f"idle before: {rss_idle / mib:.1f} MiB",
        ),
        Figure(
            "manager RSS growth once its workers are pruned",
            growth,
            "MiB",
            target=RSS_GROWTH_TARGET_MIB,
            better="max",
            detail=f"{rss_pruned / mib:.1f} MiB; workers forgotten {forgotten_after:.0f} s after the load "
            f"({left} kept: named by migrations in flight)",
        ),
    ]
