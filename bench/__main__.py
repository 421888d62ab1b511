"""Run every benchmark module (or those named): ``python -m bench [--quick] [NAME ...]``."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import bench
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
    args = parser.parse_args(argv)
    names = args.names or _modules()
    args.out.mkdir(parents=True, exist_ok=True)
    missed = failed = 0
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        print(f"== {name}: {(mod.__doc__ or '').strip().splitlines()[0]}", flush=True)
        t0 = time.perf_counter()
        try:
            figures: list[Figure] = mod.run(quick=args.quick)
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
            "figures": [f.as_dict() for f in figures],
        }
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"results written to {args.out}/ ({missed} target(s) missed, {failed} benchmark(s) failed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
