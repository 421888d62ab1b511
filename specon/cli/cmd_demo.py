"""``specon demo``: DS vs specon on the embedded default, with real training jobs; its PNGs, and
a screenshot of the specon run's status page where headless Chromium is installed."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from specon.config import PolicyError, load_policy, policy_to_yaml
from specon.coordinator.reconcile import lost_after
from specon.daemon import logs
from specon.embedded.demo import (
    MODELS,
    PageKeeper,
    machine_speed,
    make_workload,
    run_once,
    screenshot,
    step_factors,
)
from specon.embedded.host_loss import HostLoss, parse_loss
from specon.embedded.live_policies import NAMES, SIM_ONLY, WITHOUT_DAEMONS, live_policy
from specon.evaluation import Comparison, RunResult, compare

# Sizes: the default finishes within 15 minutes on 2 cores, --quick within 5.
# The workers' budgets add up to less than the machine's two cores, so the specon daemons
# (which the DS run does not have) do not eat into the jobs' CPU.
DEFAULTS = {"workers": 4, "cpus_per_worker": 0.4, "jobs": 10, "window": 60.0}
QUICK = {"workers": 2, "cpus_per_worker": 0.5, "jobs": 5, "window": 10.0}
STEP_SCALE = {False: 0.8, True: 0.3}
# Wall-clock cap of one run (seconds); a run past it reports its unfinished jobs.
RUN_DEADLINE = {False: 700.0, True: 300.0}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run a workload twice, as DS and with specon, and compare",
        description="Run one training workload twice on this machine - first as the default scheduler "
        "(DS: round-robin placement, no migrations), then with the specon manager and agents - on the "
        "same arrivals, and print per-job JCT, average JCT, makespan, share of jobs improved, "
        "migrations and rebalances. Writes results JSON and PNG plots, and a screenshot of the specon "
        "run's status page (status-page.png) when chromium is installed. While the specon run goes, its "
        "status page's address and read token file are printed. Needs root for cgroup CPU budgets "
        "(falls back to CPU affinity with a warning).",
    )
    p.add_argument(
        "--workers", type=int, help=f"workers (default {DEFAULTS['workers']}, quick {QUICK['workers']})"
    )
    p.add_argument(
        "--cpus-per-worker", type=float, help=f"CPU budget per worker (default {DEFAULTS['cpus_per_worker']})"
    )
    p.add_argument(
        "--jobs", type=int, help=f"training jobs (default {DEFAULTS['jobs']}, quick {QUICK['jobs']})"
    )
    p.add_argument(
        "--window", type=float, help="arrivals uniform in [0, WINDOW] seconds (default 60, quick 20)"
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the workload (models, arrivals, job seeds)")
    p.add_argument(
        "--no-fit",
        action="store_true",
        help="keep each model's full step count; by default a few steps of each model are timed first "
        "and the jobs shrunk so that they train about as long as on the machine the recorded traces "
        "came from (never grown)",
    )
    p.add_argument(
        "--models", default=",".join(MODELS), help=f"comma-separated models (default {','.join(MODELS)})"
    )
    p.add_argument("--quick", action="store_true", help="a smaller run (about 5 minutes on 2 cores)")
    p.add_argument(
        "--policy",
        metavar="NAME|FILE",
        default="specon",
        help=f"what runs against DS: a live policy ({', '.join(NAMES)}; default specon, the shipped "
        "defaults on the demo's clock) or a policy YAML file",
    )
    p.add_argument(
        "--json", type=Path, dest="json_path", help="write the results JSON here (default OUT/results.json)"
    )
    p.add_argument(
        "--runtime",
        choices=("local", "docker"),
        default="local",
        help="local: each worker a CPU-budgeted cgroup, jobs processes (default); docker: each worker a "
        "private Docker engine (installs docker.io if missing; needs root), jobs containers",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="local runtime: start every job in a fresh interpreter (by default each worker forks its "
        "jobs from one that imported torch once, so starts and restores skip the imports)",
    )
    p.add_argument("--out", type=Path, default=Path("specon-demo"), help="directory for results and plots")
    p.add_argument(
        "--keep", action="store_true", help="keep the runs' volumes and daemon logs under OUT/runs"
    )
    p.add_argument(
        "--lose",
        action="append",
        type=_loss,
        default=[],
        metavar="WORKER@SECONDS",
        help="lose a host (repeatable; local runtime): SECONDS after each run starts, kill WORKER's "
        "(w0, w1, ...) agent and every job process on it. With specon the manager restores its jobs "
        "elsewhere from their newest checkpoints once the worker has been silent recovery.after (18 s "
        "in the demo policy); in the DS run they restart from scratch after the same delay, as a "
        "Kubernetes Job's do. The summary then shows hosts lost, recoveries and steps lost",
    )
    p.set_defaults(func=main)


def _loss(text: str) -> HostLoss:
    try:
        return parse_loss(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _restart_after(policy: Path | None) -> float:
    """When the DS run restarts a lost job: when the compared policy's manager would find it
    lost (the demo policy's, against ``ds``)."""
    return lost_after(load_policy(policy) if policy else live_policy("specon"))


def _policy_file(name: str, out: Path) -> Path | None:
    """The policy file the run's daemons read (None: ``ds``, no daemons): a live policy's,
    written under ``out``, or the user's own file, validated first."""
    if name in WITHOUT_DAEMONS:
        return None
    if name in NAMES:
        path = out / f"policy-{name}.yaml"
        path.write_text(policy_to_yaml(live_policy(name)), encoding="utf-8")
        return path
    if name in SIM_ONLY:
        raise ValueError(f"policy {name!r} runs only in the simulator (specon sim --policy {name})")
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"{name!r} is neither a live policy ({', '.join(NAMES)}) nor a file")
    load_policy(path)
    return path


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{100 * x:+6.1f}%"


def _s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _table(base: RunResult, ours: RunResult, cmp: Comparison, name: str = "specon") -> str:
    head = f"{name} JCT"
    lines = [f"{'job':<8} {'model':<7} {'submit':>7} {'DS JCT':>8} {head:>11} {'change':>8}  moves"]
    by_id = {j.id: j for j in ours.jobs}
    for b in base.jobs:
        o = by_id[b.id]
        change = None if b.jct is None or o.jct is None or b.jct <= 0 else (b.jct - o.jct) / b.jct
        moves = " -> ".join(w for _, w in o.worker_history)
        jcts = f"{_s(b.jct):>8} {_s(o.jct):>11} {_pct(change):>8}"
        lines.append(f"{b.id:<8} {b.model:<7} {b.submit:7.1f} {jcts}  {moves}")
    lines += [
        "",
        f"average JCT   DS {_s(base.avg_jct)} s   {name} {_s(ours.avg_jct)} s   reduction "
        f"{_pct(cmp.avg_jct_reduction)}",
        f"makespan      DS {_s(base.makespan)} s   {name} {_s(ours.makespan)} s   reduction "
        f"{_pct(cmp.makespan_reduction)}",
        f"time-to-quality (95 % of the final loss reduction, mean)   DS {_s(base.avg_time_to_quality)} s   "
        f"{name} {_s(ours.avg_time_to_quality)} s   reduction {_pct(cmp.ttq_reduction)}",
        f"jobs improved {_pct(cmp.jobs_improved).strip()}   "
        f"best single-job reduction {_pct(cmp.best_reduction).strip()}   worst job "
        + ("n/a" if cmp.worst_slowdown is None else f"x{cmp.worst_slowdown:.2f} its DS JCT"),
        f"migrations    {cmp.migrations} (converged)   rebalances {cmp.rebalances}",
    ]
    lines += _losses(base, ours, name)
    # A recovery's downtime includes the time to find the host lost: not a move's cost.
    downs = [m.downtime for m in ours.migrations if m.downtime is not None and m.reason != "recovered"]
    if downs:
        lines.append(f"downtime      median {sorted(downs)[len(downs) // 2]:.2f} s   max {max(downs):.2f} s")
    return "\n".join(lines)


def _losses(base: RunResult, ours: RunResult, name: str) -> list[str]:
    """What the lost hosts cost each run (none: no line)."""
    runs = [(label, r.meta["failures"]) for label, r in (("DS", base), (name, ours)) if "failures" in r.meta]
    return [
        f"host lost     {label}: {f['hosts_lost']} host(s), {f['recoveries']} job(s) recovered elsewhere, "
        f"{f['lost_steps']} step(s) lost"
        for label, f in runs
    ]


def _fit_to_machine(models: list[str]) -> dict[str, float]:
    """Each model's share of its steps on this machine (``step_factors``), said on stdout."""
    from specon.sim.trace import load_traces  # noqa: PLC0415

    print("specon demo: timing a few training steps of each model on this machine ...", flush=True)
    measured = machine_speed(models)
    if measured is None:
        print("specon demo: could not time the models: the jobs keep their full step counts", flush=True)
        return {m: 1.0 for m in models}
    recorded = load_traces()
    nominal = {m: statistics.median(t.step_cost for t in recorded[m]) for m in models if recorded.get(m)}
    factors = step_factors(measured, nominal)
    said = ", ".join(f"{m} {measured[m] * 1000:.0f} ms/step (x{factors[m]:.2f})" for m in models)
    print(f"specon demo: {said}; the jobs' steps are scaled to train here about as long as the "
          f"recorded traces did (--no-fit keeps the full counts)", flush=True)  # fmt: skip
    return factors


def main(args: argparse.Namespace) -> int:
    # Heavy imports (matplotlib, torch) only when the demo really runs, not for --help.
    try:
        from specon.plots import plot_jct_bars, plot_timelines  # noqa: PLC0415
    except ImportError as exc:  # the `plot` extra is missing: say so before the runs, not after
        print(f"specon demo: {exc}", file=sys.stderr)
        return 2
    from specon.workloads.registry import WORKLOADS  # noqa: PLC0415

    size = QUICK if args.quick else DEFAULTS
    workers = args.workers or int(size["workers"])
    cpus = args.cpus_per_worker or float(size["cpus_per_worker"])
    n_jobs = args.jobs or int(size["jobs"])
    window = args.window if args.window is not None else float(size["window"])
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in WORKLOADS]
    if unknown or not models or workers < 1 or cpus <= 0 or n_jobs < 1 or window < 0:
        print(
            f"specon demo: bad options (unknown models: {unknown})" if unknown else "specon demo: bad sizes",
            file=sys.stderr,
        )
        return 2
    name: str = args.policy
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        policy = _policy_file(name, out)
    except (PolicyError, ValueError, OSError) as exc:
        print(f"specon demo: --policy: {exc}", file=sys.stderr)
        return 2
    label = name if name in NAMES else "specon"
    lost = sorted({loss.worker for loss in args.lose} - {f"w{i}" for i in range(workers)})
    if lost or (args.lose and args.runtime != "local"):
        why = (
            f"unknown worker(s) {', '.join(lost)} (w0..w{workers - 1})" if lost else "the local runtime only"
        )
        print(f"specon demo: --lose: {why}", file=sys.stderr)
        return 2
    restart_after = _restart_after(policy)
    # Timed only once every option is known good: a bad one fails at once.
    scale = STEP_SCALE[args.quick]
    fit = {m: 1.0 for m in models} if args.no_fit else _fit_to_machine(models)
    jobs = make_workload(
        jobs=n_jobs, window=window, seed=args.seed, models=models,
        steps=lambda m: max(50, int(WORKLOADS[m].steps * scale * fit[m])),
        spread=0.5,
    )  # fmt: skip
    work = out / "runs" if args.keep else Path(tempfile.mkdtemp(prefix="specon-demo-"))
    deadline = RUN_DEADLINE[args.quick]

    def say(line: str) -> None:
        print(line, flush=True)

    logs.configure(level="warning", fmt="console")  # the runtime's info events would drown the progress
    # SIGTERM unwinds like Ctrl-C, so the runs' daemons, jobs and cgroups are torn down.
    signal.signal(signal.SIGTERM, _interrupt)
    say(
        f"specon demo: {n_jobs} jobs ({', '.join(sorted({j.model for j in jobs}))}) on {workers} workers x "
        f"{cpus:g} CPU, arrivals in [0, {window:g}] s, seed {args.seed}, policy {policy}"
    )
    started = time.monotonic()
    page = PageKeeper()
    try:
        base = asyncio.run(
            run_once(
                jobs,
                root=work / "ds",
                workers=workers,
                cpus_per_worker=cpus,
                with_specon=False,
                policy=None,
                say=say,
                deadline=deadline,
                label="DS",
                runtime=args.runtime,
                warm=not args.cold,
                lose=args.lose,
                restart_after=restart_after,
            )
        )
        ours = asyncio.run(
            run_once(
                jobs,
                root=work / "policy",
                workers=workers,
                cpus_per_worker=cpus,
                with_specon=policy is not None,
                policy=policy,
                say=say,
                deadline=deadline,
                label=label,
                runtime=args.runtime,
                warm=not args.cold,
                page=page,
                lose=args.lose,
                restart_after=restart_after,
            )
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    cmp = compare(base, ours)
    doc = {
        "baseline": base.to_json(),
        "specon": ours.to_json(),
        "runtime": args.runtime,
        "summary": {
            "avg_jct_reduction": cmp.avg_jct_reduction,
            "makespan_reduction": cmp.makespan_reduction,
            "jobs_improved": cmp.jobs_improved,
            "best_reduction": cmp.best_reduction,
            "migrations": cmp.migrations,
            "rebalances": cmp.rebalances,
            "worst_slowdown": cmp.worst_slowdown,
            "ttq_reduction": cmp.ttq_reduction,
        },
        "config": {"workers": workers, "cpus_per_worker": cpus, "jobs": n_jobs, "window": window,
                   "seed": args.seed, "quick": args.quick, "policy": name,
                   "step_factors": {m: round(f, 3) for m, f in fit.items()},
                   "lose": [f"{loss.worker}@{loss.at:g}" for loss in args.lose],
                   "seconds": round(time.monotonic() - started, 1)},
    }  # fmt: skip
    json_path = args.json_path or out / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    plot_timelines([("DS (default scheduler)", base), (label, ours)], out / "timeline.png")
    plot_jct_bars(base, ours, out / "jct.png")
    shot = out / "status-page.png"
    why_not = "the run had no status page" if page.html is None else screenshot(page.html, shot)
    say("")
    say(_table(base, ours, cmp, label))
    say(
        f"\nresults: {json_path}   plots: {out / 'timeline.png'}, {out / 'jct.png'}   "
        f"({time.monotonic() - started:.0f} s)"
    )
    say(f"status page: {shot}" if why_not is None else f"status page: no screenshot, {why_not}")
    return 0 if all(j.finish is not None for j in (*base.jobs, *ours.jobs)) else 1
