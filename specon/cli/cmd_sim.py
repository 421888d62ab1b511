"""``specon sim``: a paper scenario, or a user's own cluster, in the simulator, every policy
on identical workloads.

``--scenario`` is a built-in name (A1..A5) or a scenario file (``specon.sim.scenario_file``:
workers and jobs as YAML or JSON, GPU workers and GPU jobs among them). Prints a markdown
table of DS, specon-paper, specon, balancer and the lower bound, beside the paper's numbers
for a built-in; optionally writes JSON (``--json``), the table (``--markdown``) and PNG
plots (``--plot``). Progress goes to stderr. ``--policy`` takes a policy name or a policy
file (simulated as ``specon`` on top of that file); ``--params`` and the individual options
override the simulator's measured parameters. ``--mtbf`` (and ``--repair``) make any
scenario's hosts fail (``specon.sim.failures``); the table then adds the lost work. Bad input
(an unknown scenario or policy, an invalid scenario, policy or parameter file, invalid
alpha/interval/weights/failure options, unreadable traces or arrivals) is reported on stderr
with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import time
from pathlib import Path

from specon.config import Policy, PolicyError, load_policy
from specon.sim.calibration import load_params, params_from_dict
from specon.sim.cluster import DEFAULT_PARAMS, SimParams
from specon.sim.experiment import run_scenario
from specon.sim.failures import DEFAULT_REPAIR
from specon.sim.policies import POLICIES
from specon.sim.report import markdown, to_json, write_plots
from specon.sim.scenario_file import load_scenario
from specon.sim.scenarios import SCENARIOS, ArrivalError, Scenario, Traces, read_arrivals, scenario
from specon.sim.trace import DEFAULT_TRACE_DIR, TraceError, load_traces

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sim",
        help="simulate a paper scenario or your own cluster: DS, specon, a balancer and a lower bound",
        description=(
            "Run one of the paper's scenarios (SPEC §8), or your own cluster from a scenario file, "
            "in the discrete-event simulator, which calls the same Algorithm 1-3 code as the "
            "daemons, for every policy on identical workloads over several seeds, and print "
            "mean ± 95 % CI (beside the paper's numbers for A1..A5)."
        ),
    )
    p.add_argument(
        "--scenario",
        required=True,
        metavar="NAME|FILE",
        help=f"a built-in scenario, {', '.join(SCENARIOS)} (see SPEC §8), or a scenario FILE (YAML "
        "or JSON): apiVersion: specon/v1alpha1, kind: Scenario, name, workers: [{name, cpu[, gpus, "
        "gpu_memory, gpu_product, gpu_share]}], and jobs: a list of {submit, model, steps[, worker, id, "
        "gpu, gpu_step, gpu_memory, gpu_product, checkpoint]} or a generator {count, models, "
        "arrivals: {uniform: [lo, hi]} | {fixed: {every: S}} | {poisson: {rate: R}}, steps: N | "
        "[lo, hi]}; a model is a trace name (see --traces) or a trace JSON file; a job costs steps "
        "x the trace's step_cost (see the README)",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME|FILE",
        help=f"a policy to run (repeatable; default all: {', '.join(POLICIES)}); ds always runs. "
        "A policy FILE (YAML, as the daemons read) is simulated as 'specon' with the file in place "
        "of the shipped defaults; its alpha and interval are used unless --alpha/--interval are given, "
        "and --weights still overrides it",
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
        "--arrivals",
        type=Path,
        help="CSV/JSON of submit times (and models) replacing a built-in scenario's",
    )
    p.add_argument(
        "--params",
        type=Path,
        metavar="FILE",
        help="simulator parameters, a JSON or YAML mapping of "
        f"{', '.join(f.name for f in dataclasses.fields(SimParams))} (as `python -m bench "
        "bench_calibration` writes to bench/results/calibration_params.json); unset ones keep "
        "their defaults",
    )
    p.add_argument(
        "--migration-downtime",
        "--downtime",
        type=float,
        dest="downtime",
        metavar="S",
        help="median migration downtime, save + restore, seconds; each move draws its own around it "
        f"(default {DEFAULT_PARAMS.migration_downtime:g}, measured; overrides --params)",
    )
    p.add_argument(
        "--interference",
        type=float,
        metavar="X",
        help="per-step cost multiplier of jobs on an oversubscribed worker, >= 1 "
        f"(default {DEFAULT_PARAMS.interference:g}; 1 = ideal sharing; overrides --params)",
    )
    p.add_argument(
        "--interference-exponent",
        type=float,
        metavar="G",
        help="the multiplier grows as r ** G with r = jobs per core on the worker, G >= 0 "
        f"(default {DEFAULT_PARAMS.interference_exponent:g}, measured; 0 = constant; overrides --params)",
    )
    p.add_argument(
        "--mtbf",
        type=float,
        metavar="S",
        help="hosts fail: each worker's mean time between failures, seconds (exponential, drawn from "
        "the seed; every policy of a seed meets the same failures), for any scenario, replacing a "
        "scenario file's own. A lost host's jobs are lost since their last checkpoint (every 200 steps "
        "or 60 s); the manager restores them elsewhere after recovery.after (60 s); under ds they "
        "restart from scratch after the same delay. The table then adds the lost work per policy",
    )
    p.add_argument(
        "--repair",
        type=float,
        metavar="S",
        help=f"with failures: seconds a lost worker stays down before it comes back empty "
        f"(default {DEFAULT_REPAIR:g}, or the scenario file's)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def _fail(message: str) -> int:
    print(f"specon sim: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _plots_missing() -> str | None:
    """Why ``--plot`` cannot work (matplotlib, the ``plot`` extra, is not installed), or None."""
    try:
        importlib.import_module("specon.plots")
    except ImportError as exc:
        return str(exc)
    return None


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


def _policies(values: list[str] | None) -> tuple[tuple[str, ...], Path | None]:
    """The policy names to run, and the policy file ``specon`` runs on (a FILE counts as
    selecting ``specon``)."""
    if not values:
        return POLICIES, None
    files = [v for v in values if v not in POLICIES]
    if len(files) > 1:
        raise ValueError(f"--policy: at most one policy file, got {', '.join(files)}")
    if files and not Path(files[0]).is_file():
        raise ValueError(f"--policy: {files[0]!r} is neither a policy ({', '.join(POLICIES)}) nor a file")
    names = ("specon" if v in files else v for v in values)
    return tuple(dict.fromkeys(names)), Path(files[0]) if files else None


def _scenario(value: str, arrivals: Path | None, traces: Traces) -> tuple[Scenario, Path | None]:
    """The built-in scenario ``value`` names, else the scenario file at ``value`` (and its
    path). A built-in name wins over a file of that name."""
    if value.upper() in SCENARIOS:
        sc = scenario(value)
        return (sc if arrivals is None else sc.with_arrivals(read_arrivals(arrivals))), None
    path = Path(value)
    if not path.is_file():
        raise ValueError(
            f"--scenario: {value!r} is neither a built-in scenario ({', '.join(SCENARIOS)}) nor a file"
        )
    if arrivals is not None:
        raise ValueError("--arrivals: a scenario file lists its own jobs; it replaces only A1..A5's")
    return load_scenario(path, traces), path


def _failures(sc: Scenario, mtbf: float | None, repair: float | None) -> Scenario:
    """``sc`` with ``--mtbf`` and ``--repair`` applied (``--repair`` alone needs failures)."""
    for flag, value in (("--mtbf", mtbf), ("--repair", repair)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a number of seconds > 0, got {value:g}")
    if mtbf is None and repair is None:
        return sc
    if mtbf is None and sc.failures is None:
        raise ValueError("--repair: the scenario has no failures; give --mtbf too")
    return sc.with_failures(mtbf=mtbf, repair=repair)


def _params(args: argparse.Namespace) -> SimParams:
    """DEFAULT_PARAMS, then --params, then the individual options."""
    params = DEFAULT_PARAMS if args.params is None else load_params(args.params)
    options = {
        "migration_downtime": args.downtime,
        "interference": args.interference,
        "interference_exponent": args.interference_exponent,
    }
    return params_from_dict(
        {k: v for k, v in options.items() if v is not None}, base=params, source="options"
    )


def main(args: argparse.Namespace) -> int:
    if args.plot is not None and (missing := _plots_missing()) is not None:
        return _fail(missing)  # before the run, not after it
    try:
        weights = _weights(args.weights)
        params = _params(args)
        policies, policy_file = _policies(args.policy)
        base: Policy | None = None if policy_file is None else load_policy(policy_file)
        # A policy file's alpha and interval are the run's own, unless overridden.
        alpha = args.alpha if args.alpha is not None or base is None else base.monitor.alpha
        interval = args.interval if args.interval is not None or base is None else base.monitor.interval
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        traces = load_traces(args.traces)
        sc, scenario_file = _scenario(args.scenario, args.arrivals, traces)
        sc = _failures(sc, args.mtbf, args.repair)
    except (ValueError, ArrivalError, TraceError) as exc:  # Policy/ScenarioFileError are ValueErrors
        return _fail(str(exc))
    # A scenario file may name only trace files; its unknown models list what there is.
    if scenario_file is None and not any(traces.values()):
        where = args.traces or DEFAULT_TRACE_DIR
        return _fail(f"no traces under {where}; record some with `specon trace record`")
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
            alpha=alpha,
            interval=interval,
            weights=weights,
            params=params,
            progress=progress,
            base=base,
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
        doc = to_json(result)
        if policy_file is not None:
            doc["policy_file"] = str(policy_file)
        if scenario_file is not None:
            doc["scenario_file"] = str(scenario_file)
        args.json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        for path in write_plots(result, args.plot):
            progress(f"wrote {path}")
    return 0
