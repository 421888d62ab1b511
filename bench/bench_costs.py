"""The cost of a move, measured and learned (issue 24, item 3).

Two parts:

* ``python -m bench.bench_costs --measure --name NAME``: moves a VAE job back and forth between
  two busy 0.5-CPU local workers with the warm interpreter (``bench_calibration.measure_moves``)
  and measures each model's warm start-up CPU (``measure_startup``), and records the samples
  with the machine, its load and the command as set NAME of ``specon/data/move_costs.json``:
  the table the simulator's downtime law is fitted to (``specon.sim.cluster.fit_downtime``, the
  set the table's ``simulator`` names).
* ``python -m bench bench_costs`` (the figures): a sweep in the simulator, the shipped policy
  with ``placement.max_migrations_per_container`` 1, 2, 3, the work-model gate on Algorithm 2
  (``placement.require_gain``) on and off, and rebalancing by counts (``rebalance.mode:
  balanced``, its moves checked only for fairness) or by the work model (``work``: a move only
  where it pays), each move's downtime drawn from the measured law and the simulated manager
  learning from it (``migration.learn_costs``): mean average-JCT reduction against DS over
  seeds per scenario, mean time-to-quality reduction, the worst job's JCT over its DS JCT, and
  moves per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.figures import Figure
from specon.config import Policy, default_policy
from specon.config.sections import RebalanceMode
from specon.evaluation import compare
from specon.policy.experiments import experiment
from specon.sim.cluster import DEFAULT_PARAMS, SimParams, fit_downtime
from specon.sim.policies import make_policy, sim_policy
from specon.sim.runner import simulate
from specon.sim.scenarios import scenario
from specon.sim.trace import load_traces

TABLE = Path(__file__).resolve().parent.parent / "specon" / "data" / "move_costs.json"
SCENARIOS = ("A1", "A2", "A3", "A4", "A5")
SEEDS = {False: 3, True: 1}
MAX_MIGRATIONS = (1, 2, 3)
MODES: tuple[RebalanceMode, ...] = ("balanced", "work")
Variant = tuple[int, bool, RebalanceMode]  # max_migrations, gate, rebalance mode


def _variant(base: Policy, v: Variant) -> Policy:
    max_migrations, gate, mode = v
    return replace(
        base,
        placement=replace(base.placement, max_migrations_per_container=max_migrations, require_gain=gate),
        rebalance=replace(base.rebalance, mode=mode),
    )


def sweep(
    scenarios: tuple[str, ...], seeds: int, params: SimParams = DEFAULT_PARAMS, base: Policy | None = None
) -> dict[Variant, dict[str, dict[str, float]]]:
    """Variant -> scenario -> mean JCT and TTQ reduction against DS (fractions), worst
    slowdown and mean moves per run; each variant laid over ``base`` (default: the shipped policy)."""
    traces = load_traces()
    ds = make_policy("ds")
    exp = experiment("specon")
    base = base or default_policy()
    out: dict[Variant, dict[str, dict[str, float]]] = {}
    variants = [(mm, gate, mode) for mm in MAX_MIGRATIONS for gate in (True, False) for mode in MODES]
    for name in scenarios:
        sc = scenario(name)
        loads = [sc.workload(s, traces) for s in range(seeds)]
        baselines = [simulate(w, ds, params=params) for w in loads]
        for v in variants:
            pol = sim_policy(exp, exp.policy(_variant(base, v)))
            cmp = [compare(b, simulate(w, pol, params=params)) for w, b in zip(loads, baselines, strict=True)]
            out.setdefault(v, {})[name] = {
                "jct": statistics.fmean(c.avg_jct_reduction or 0.0 for c in cmp),
                "ttq": statistics.fmean(c.ttq_reduction or 0.0 for c in cmp),
                "worst": max(c.worst_slowdown or 0.0 for c in cmp),
                "moves": statistics.fmean(c.migrations + c.rebalances for c in cmp),
            }
    return out


def table(result: dict[Variant, dict[str, dict[str, float]]]) -> str:
    """The sweep as a Markdown table (JCT and TTQ reductions in %, worst slowdown, moves)."""
    names = list(next(iter(result.values())))
    head = "| max_migrations | gate | rebalance | " + " | ".join(names) + " | mean JCT |"
    rule = "|---|---|---|" + "---:|" * (len(names) + 1)
    rows = [head, rule]
    for (mm, gate, mode), per in result.items():
        cells = [
            f"{100 * v['jct']:.1f} / {100 * v['ttq']:.1f} / x{v['worst']:.2f} / {v['moves']:.1f}"
            for v in per.values()
        ]
        mean = statistics.fmean(v["jct"] for v in per.values())
        rows.append(
            f"| {mm} | {'on' if gate else 'off'} | {mode} | " + " | ".join(cells) + f" | {100 * mean:.1f} |"
        )
    return "\n".join(rows)


def run(quick: bool) -> list[Figure]:
    t0 = time.process_time()
    scenarios = ("A1", "A3") if quick else SCENARIOS
    result = sweep(scenarios, SEEDS[quick])
    print(table(result), flush=True)
    figures = []
    for (mm, gate, mode), per in result.items():
        figures.append(
            Figure(
                f"avg JCT reduction vs DS, max_migrations {mm}, gate {'on' if gate else 'off'}, "
                f"rebalance {mode} (mean over {', '.join(per)})",
                100 * statistics.fmean(v["jct"] for v in per.values()),
                "%",
                better="min",
                detail="; ".join(
                    f"{n} jct {100 * v['jct']:.1f} % ttq {100 * v['ttq']:.1f} % worst x{v['worst']:.2f}"
                    for n, v in per.items()
                ),
            )
        )
    print(f"  ({time.process_time() - t0:.1f} s CPU)")
    return figures


# -- measuring -------------------------------------------------------------------------------
def measure(moves: int) -> dict[str, Any]:
    """Warm-interpreter moves and start-ups on this machine (see the module docstring)."""
    from bench.bench_calibration import measure_moves, measure_startup  # noqa: PLC0415 (torch)

    load = os.getloadavg()
    startup: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="specon-bench-costs-") as tmp:
        root = Path(tmp)
        for model, traces in sorted(load_traces().items()):
            cost = statistics.fmean(t.step_cost for t in traces)
            startup[model] = round(
                asyncio.run(measure_startup(root / f"s-{model}", model, cost, warm=True)), 3
            )
        downs = asyncio.run(measure_moves(root / "moves", cpus=0.5, busy=True, moves=moves, warm=True))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return {
        "command": f"python -m bench.bench_costs --measure --moves {moves}",
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "load_average": [round(load[0], 2), round(os.getloadavg()[0], 2)],
        "downtime": {"samples": [round(x, 3) for x in downs]},
        "restore_cpu": startup,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_costs", description=__doc__)
    p.add_argument(
        "--measure", action="store_true", help=f"measure real moves and record them in {TABLE.name}"
    )
    p.add_argument("--name", default="measured", help="the set --measure records (default: measured)")
    p.add_argument("--moves", type=int, default=8, help="moves to measure (default 8)")
    p.add_argument(
        "--out", type=Path, default=TABLE, help="where --measure writes (default the packaged table)"
    )
    p.add_argument("--seeds", type=int, default=SEEDS[False], help="seeds per scenario in the sweep")
    p.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), help="scenarios of the sweep")
    p.add_argument("--priority", help="the sweep's node priority rule (default: the shipped policy's)")
    args = p.parse_args(argv)
    if args.measure:
        data = measure(args.moves)
        table_ = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {"sets": {}}
        table_["sets"][args.name] = data
        args.out.write_text(json.dumps(table_, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(data, indent=1))
        print(f"downtime law fitted to it: median, log-spread {fit_downtime(data['downtime'])}")
        return 0
    base = default_policy()
    if args.priority:
        base = replace(base, priority=replace(base.priority, rule=args.priority))
    print(f"priority rule {base.priority.rule}")
    print(table(sweep(tuple(args.scenarios), args.seeds, base=base)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
