"""Run every benchmark module (or those named): ``python -m bench [--quick] [NAME ...]``.

Ends with the regression guard (``bench.baseline``): every figure that moved more than 10 %
the wrong way against ``bench/baseline.json`` (the baseline of the run's size). Exit status:
1 when a benchmark failed, or with ``--strict`` when a figure regressed; 2 when the baseline
cannot be read; else 0.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import bench
from bench import baseline
from bench.figures import Figure

RESULTS = Path(__file__).resolve().parent / "results"


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "names", nargs="*", help="benchmark modules to run (default: all), e.g. bench_progress"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON results")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=baseline.BASELINE,
        help="the baseline the figures are compared with (default bench/baseline.json)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a figure moved more than 10 %% the wrong way"
    )
    parser.add_argument(
        "--update-baseline",
        action="store_true",
        help="record this run's figures as the baseline of its size instead of comparing "
        "(commit bench/baseline.json in a commit that says why)",
    )
    args = parser.parse_args(argv)
    names = args.names or _modules()
    args.out.mkdir(parents=True, exist_ok=True)
    where = baseline.machine()
    command = " ".join(["python -m bench", *(["--quick"] if args.quick else []), *names])
    docs: list[dict[str, object]] = []
    missed = failed = 0
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        print(f"== {name}: {(mod.__doc__ or '').strip().splitlines()[0]}", flush=True)
        t0 = time.perf_counter()
        try:
            # A module that writes files beside its figures takes ``out`` (bench_quality_point).
            extra = {"out": args.out} if "out" in inspect.signature(mod.run).parameters else {}
            figures: list[Figure] = mod.run(quick=args.quick, **extra)
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"  FAILED: {type(exc).__name__}: {exc}", flush=True)
            failed += 1
            continue
        for fig in figures:
            print(fig.line(), flush=True)
            missed += fig.met is False
        doc = {
            "benchmark": name,
            "quick": args.quick,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "seconds": round(time.perf_counter() - t0, 3),
            "measured": {**where, "command": command},
            "figures": [f.as_dict() for f in figures],
        }
        docs.append(doc)
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results written to {args.out}/ ({missed} target(s) missed, {failed} benchmark(s) failed)")
    guard = _guard(docs, args.baseline, update=args.update_baseline, strict=args.strict)
    return guard or (1 if failed else 0)


def _guard(docs: list[dict[str, object]], path: Path, *, update: bool, strict: bool) -> int:
    """Compare the run with the baseline (or record it as the baseline); 1 for a regression
    under ``strict``, 2 for an unreadable baseline."""
    try:
        doc = baseline.load(path)
    except (OSError, ValueError) as exc:
        print(f"baseline {path}: unreadable ({exc}); not compared", file=sys.stderr)
        return 2
    if update:
        for line in baseline.update(doc, docs):
            print(f"baseline: recorded {line} in {path}")
        baseline.save(doc, path)
        return 0
    verdicts, notes = baseline.check(doc, docs)
    print(f"== regression guard: against {path}")
    print("\n".join(baseline.report(verdicts, notes)), flush=True)
    return 1 if strict and any(v.status == "regressed" for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
