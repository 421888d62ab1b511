"""``specon sim``: a paper scenario in the simulator, every policy on identical workloads.

Prints a markdown table of DS, specon-paper, specon, balancer and the lower bound beside
the paper's numbers; optionally writes JSON (``--json``), the table (``--markdown``) and
PNG plots (``--plot``). Progress goes to stderr. Bad input (an unknown policy, invalid
alpha/interval/weights, unreadable traces or arrivals) is reported on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specon.config import PolicyError
from specon.sim.cluster import SimParams
from specon.sim.experiment import run_scenario
from specon.sim.policies import POLICIES
from specon.sim.report import markdown, to_json, write_plots
from specon.sim.scenarios import SCENARIOS, ArrivalError, read_arrivals, scenario
from specon.sim.trace import DEFAULT_TRACE_DIR, TraceError, load_traces

EXIT_BAD_INPUT = 2
_DEFAULTS = SimParams()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate a paper scenario: DS, specon, a balancer and a lower bound, side by side",
        description=(
            "Run one of the paper's scenarios (SPEC §8) in the discrete-event simulator, which "
            "calls the same Algorithm 1-3 code as the daemons, for every policy on identical "
            "workloads over several seeds, and print mean ± 95 % CI beside the paper's numbers."
        ),
    )
    p.add_argument(
        "--scenario", required=True, type=str.upper, choices=list(SCENARIOS), help="A1 .. A5 (see SPEC §8)"
    )
    p.add_argument(
        "--policy",
        action="append",
        choices=POLICIES,
        metavar="NAME",
        help=f"a policy to run (repeatable; default all: {', '.join(POLICIES)}); ds always runs",
    )
    p.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1, one workload each (default 10)")
    p.add_argument("--alpha", type=float, help="alpha of the specon policies (default: the scenario's)")
    p.add_argument(
        "--interval", type=float, help="the tick interval (Delta) in seconds (default: the scenario's)"
    )
    p.add_argument("--weights", help="Algorithm 2 weights progressing,watching,converged (e.g. 2,1.5,1)")
    p.add_argument("--json", type=Path, dest="json_path", help="write the results JSON here")
    p.add_argument("--markdown", type=Path, help="write the markdown table here")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write jct_cdf.png and timelines.png here")
    p.add_argument("--traces", type=Path, help=f"directory of trace JSON files (default {DEFAULT_TRACE_DIR})")
    p.add_argument(
        "--arrivals", type=Path, help="CSV/JSON of submit times (and models) replacing the scenario's"
    )
    p.add_argument(
        "--downtime",
        type=float,
        default=_DEFAULTS.migration_downtime,
        help=f"migration downtime, save + restore, seconds (default {_DEFAULTS.migration_downtime:g})",
    )
    p.add_argument(
        "--interference",
        type=float,
        default=_DEFAULTS.interference,
        help="slowdown factor of time-shared steps on an oversubscribed worker (default 1 = ideal)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def _fail(message: str) -> int:
    print(f"specon sim: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _weights(text: str | None) -> tuple[float, float, float] | None:
    if text is None:
        return None
    parts = [x.strip() for x in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"--weights: expected three numbers a,b,c, got {text!r}")
    try:
        a, b, c = (float(x) for x in parts)
    except ValueError:
        raise ValueError(f"--weights: not numbers: {text!r}") from None
    return a, b, c


def main(args: argparse.Namespace) -> int:
    try:
        weights = _weights(args.weights)
        params = SimParams(migration_downtime=args.downtime, interference=args.interference)
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        sc = scenario(args.scenario)
        if args.arrivals is not None:
            sc = sc.with_arrivals(read_arrivals(args.arrivals))
        traces = load_traces(args.traces)
    except (ValueError, ArrivalError, TraceError) as exc:
        return _fail(str(exc))
    if not any(traces.values()):
        where = args.traces or DEFAULT_TRACE_DIR
        return _fail(f"no traces under {where}; record some with `specon trace record`")
    policies = tuple(dict.fromkeys(args.policy or POLICIES))
    started = time.monotonic()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"{time.monotonic() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    try:
        result = run_scenario(
            sc,
            traces,
            policies=policies,
            seeds=args.seeds,
            alpha=args.alpha,
            interval=args.interval,
            weights=weights,
            params=params,
            progress=progress,
        )
    except PolicyError as exc:
        return _fail(str(exc))
    except ValueError as exc:
        return _fail(str(exc))
    table = markdown(result)
    sys.stdout.write(table)
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")
    if args.json_path is not None:
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        args.json_path.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        for path in write_plots(result, args.plot):
            progress(f"wrote {path}")
    return 0
