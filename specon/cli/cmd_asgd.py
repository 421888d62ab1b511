"""``specon asgd``: MB-ASGD's throughput model and node allocation across async-SGD jobs.

``specon asgd model`` solves one job's queueing network (Section III) from a one-worker
profile and prints its throughput, speedup and efficiency per worker count, and the node
counts KNEE and HELL would give it. ``specon asgd sim`` simulates a 100-node cluster of
Table III jobs under one policy at each load and prints the mean response time and whether
the queue stayed stable. Bad input is reported on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
import time
from pathlib import Path

from specon.sim.asgd.allocation import MODES, POLICIES, Settings
from specon.sim.asgd.cluster import SimConfig
from specon.sim.asgd.dnn import WORKLOADS, workload
from specon.sim.asgd.mva import METHODS, Method, ServiceTimes, check_method, check_workers
from specon.sim.asgd.report import choices, model_table, points_json, sweep, table

EXIT_BAD_INPUT = 2
MAX_MODEL_WORKERS = 1000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "asgd",
        help="MB-ASGD: async-SGD throughput by MVA, and KNEE/HELL node allocation in a simulated cluster",
        description="Asynchronous-SGD jobs with a parameter server (MB-ASGD): the throughput "
        "model of one job, and the scheduling of many on a cluster.",
    )
    sub = p.add_subparsers(dest="asgd_command", metavar="{model,sim}", required=True)

    m = sub.add_parser(
        "model",
        help="throughput, speedup and efficiency of one job per worker count, and its KNEE/HELL nodes",
        description="Solve the closed queueing network of one async-SGD job (a worker per task, the "
        "parameter server's uplink, update and downlink shared) by MVA, from the mean seconds of "
        "one mini-batch at each station as a one-worker profile measures them.",
    )
    m.add_argument(
        "--worker", type=float, required=True, metavar="S", help="seconds a worker computes a gradient"
    )
    m.add_argument(
        "--uplink", type=float, required=True, metavar="S", help="seconds to send a gradient to the PS"
    )
    m.add_argument(
        "--server", type=float, required=True, metavar="S", help="seconds the PS applies an update"
    )
    m.add_argument(
        "--downlink", type=float, required=True, metavar="S", help="seconds to send the parameters back"
    )
    m.add_argument("--max-workers", type=int, default=16, metavar="N", help="workers 1..N (default 16)")
    m.add_argument(
        "--method",
        choices=[*METHODS, "all"],
        default="all",
        help="exact (links processor-sharing), approx (links FCFS, deterministic), hybrid (the "
        "paper's Eq. 3-4), or all (default)",
    )
    m.add_argument("--alpha", type=float, default=0.01, help="KNEE's threshold (default 0.01, the paper's)")
    m.add_argument("--json", type=Path, dest="json_path", help="write the curves as JSON here")
    m.set_defaults(func=main_model)

    s = sub.add_parser(
        "sim",
        help="simulate a 100-node cluster of Table III jobs under one policy at each load",
        description="Poisson arrivals of NiN/GoogLeNet/AlexNet/VGG19 jobs (Table III: K520 GPUs, "
        "1 Gbps links, batches of 1024) at load lambda*E[S(1)]/n; the policy reallocates at every "
        "arrival and departure. Prints mean response time (hours, 95 %% CI) and stability per load.",
    )
    s.add_argument("--policy", choices=POLICIES, default="hell", help="allocation policy (default hell)")
    s.add_argument(
        "--mode", choices=MODES, default="malleable", help="malleable (default) or moldable (knee, hell)"
    )
    s.add_argument(
        "--load", default="0.1,0.3,0.5,0.7", help="comma-separated loads (default 0.1,0.3,0.5,0.7)"
    )
    s.add_argument(
        "--models", choices=list(WORKLOADS), default="all", help="all four models, or large (AlexNet, VGG19)"
    )
    s.add_argument(
        "--gamma", type=float, default=0.0, help="early-termination exponent (Section VI; default 0: off)"
    )
    s.add_argument("--alpha", type=float, default=0.01, help="malleable KNEE's threshold (default 0.01)")
    s.add_argument("--no-filling", action="store_true", help="leave KNEE's and HELL's idle nodes idle")
    s.add_argument("--nodes", type=int, default=100, help="nodes in the cluster (default 100)")
    s.add_argument("--seeds", type=int, default=2, metavar="N", help="seeds 0..N-1 per load (default 2)")
    s.add_argument("--jobs", type=int, default=1500, metavar="N", help="arrivals per run (default 1500)")
    s.add_argument("--method", choices=METHODS, default="hybrid", help="MVA method of the speed curves")
    s.add_argument("--json", type=Path, dest="json_path", help="write the results JSON here")
    s.add_argument("--plot", type=Path, metavar="DIR", help="write response_cdf.png (one line per load) here")
    s.add_argument("--quiet", action="store_true", help="no progress on stderr")
    s.set_defaults(func=main_sim)


def _fail(message: str) -> int:
    print(f"specon asgd: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--load: not numbers: {text!r}") from None
    if not loads or any(not (math.isfinite(x) and 0 < x <= 10) for x in loads):
        raise ValueError(f"--load: each load must be in (0, 10], got {text!r}")
    return loads


def main_model(args: argparse.Namespace) -> int:
    try:
        times = ServiceTimes(args.worker, args.uplink, args.server, args.downlink)
        check_workers(args.max_workers)
        if args.max_workers > MAX_MODEL_WORKERS:
            raise ValueError(f"--max-workers must be at most {MAX_MODEL_WORKERS}, got {args.max_workers}")
        Settings(alpha=args.alpha)
        methods: list[Method] = list(METHODS) if args.method == "all" else [check_method(args.method)]
    except ValueError as exc:
        return _fail(str(exc))
    print(
        f"one mini-batch, one worker: {times.cycle:.4g} s; bound 1/{times.bottleneck:.4g} s = "
        f"{1 / times.bottleneck:.4g} mini-batches/s"
    )
    print("nodes = workers + 1 (the parameter server); E = speedup / nodes\n")
    print(model_table(times, args.max_workers, methods))
    print()
    picks = {m: choices(times, args.max_workers, args.alpha, m) for m in methods}
    for m, c in picks.items():
        print(
            f"{m}: KNEE (alpha {args.alpha:g}) {c['knee_nodes']} nodes, HELL {c['hell_nodes']} nodes, "
            f"fastest {c['fastest_nodes']} nodes (of {args.max_workers + 1})"
        )
    if args.json_path is not None:
        from specon.sim.asgd.mva import curve  # noqa: PLC0415

        doc = {
            "times": {
                "worker": times.worker,
                "uplink": times.uplink,
                "server": times.server,
                "downlink": times.downlink,
            },
            "throughput": {m: list(curve(times, args.max_workers, m)) for m in methods},
            "choices": picks,
            "alpha": args.alpha,
        }
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


def main_sim(args: argparse.Namespace) -> int:
    if args.plot is not None:
        try:
            importlib.import_module("specon.plots")
        except ImportError as exc:
            return _fail(str(exc))
    try:
        loads = _loads(args.load)
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        settings = Settings(
            args.policy, args.mode, alpha=args.alpha, gamma=args.gamma, filling=not args.no_filling
        )
        base = SimConfig(
            settings, models=workload(args.models), nodes=args.nodes, jobs=args.jobs, method=args.method
        )
    except ValueError as exc:
        return _fail(str(exc))
    started = time.monotonic()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"{time.monotonic() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    points = sweep(base, loads, args.seeds, progress)
    name = f"{args.mode} {args.policy}" + (f" gamma {args.gamma:g}" if args.gamma else "")
    print(table(f"mean response time (hours), {args.models} models, {args.nodes} nodes", {name: points}))
    print()
    for p in points:
        state = "stable" if p.stable else "UNSTABLE: " + "; ".join(sorted(set(p.reasons)))
        extra = (
            ""
            if p.skipped
            else (
                f", time to 40 % {p.mean_to_mark:.1f} h, {p.mean_in_system:.1f} jobs in system, "
                f"{100 * p.utilisation:.0f} % of nodes allocated"
            )
        )
        print(f"load {p.load:g}: {state}{extra}")
    if args.json_path is not None:
        doc = {
            "policy": args.policy,
            "mode": args.mode,
            "models": args.models,
            "gamma": args.gamma,
            "alpha": args.alpha,
            "filling": not args.no_filling,
            "nodes": args.nodes,
            "jobs": args.jobs,
            "seeds": args.seeds,
            "method": args.method,
            "points": points_json(points),
        }
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        from specon.plots import plot_jct_cdfs  # noqa: PLC0415  (matplotlib: only for --plot)

        args.plot.mkdir(parents=True, exist_ok=True)
        out = args.plot / "response_cdf.png"
        series = [(f"load {p.load:g}", [h * 3600 for h in p.responses]) for p in points if p.responses]
        if series:
            plot_jct_cdfs(series, out, title=f"{name}: response time CDF")
            progress(f"wrote {out}")
    return 0
