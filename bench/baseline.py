"""The regression guard: each figure a run measured against the committed ``bench/baseline.json``.

``python -m bench`` ends with every figure that moved more than ``TOLERANCE`` (10 %) the wrong
way against the baseline of the same size (quick runs against quick baselines, full against
full). A figure's wrong way is its ``better`` direction turned round; a percentage figure
(unit "%", itself a change such as "avg JCT change vs DS") is judged on at least
``PERCENT_FLOOR`` points of scale, so one near zero may drift 1 point. Where a benchmark
reports CPU-time figures (``Figure.clock == "cpu"``) its wall-clock ones are shown but not
judged: a shared machine moves wall time, not CPU time.

``python -m bench.baseline [NAME ...]`` compares the results already in ``bench/results``
without running anything; ``--update`` records them as the new baseline (only in a commit
that says why). The decision (``judge``) is pure; reading and writing the files is apart.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"
RESULTS = HERE / "results"
TOLERANCE = 0.10
PERCENT_FLOOR = 10.0
# A figure's better direction as the baseline writes it; Figure.better names the target's kind.
HIGHER, LOWER = "higher", "lower"

Size = Literal["quick", "full"]
Status = Literal["regressed", "improved", "steady", "new", "unmeasured", "unguarded", "invalid"]


def size(quick: bool) -> Size:
    return "quick" if quick else "full"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One figure against its baseline; ``worse``: the move the wrong way as a share of the
    scale (negative: it got better), None where there is nothing to compare."""

    benchmark: str
    name: str
    status: Status
    unit: str = ""
    baseline: float | None = None
    value: float | None = None
    worse: float | None = None
    why: str = ""


def direction(figure: Mapping[str, Any]) -> str:
    """``Figure.better`` "min" (the value should be at least its target) means higher is better."""
    return HIGHER if figure.get("better") == "min" else LOWER


def _finite(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def worse_by(base: float, value: float, unit: str, better: str) -> float:
    """How far ``value`` moved the wrong way from ``base``, as a share of the scale
    (|base|, at least PERCENT_FLOOR for a "%" figure); inf for any worsening of a zero base."""
    moved = (base - value) if better == HIGHER else (value - base)
    scale = max(abs(base), PERCENT_FLOOR if unit == "%" else 0.0)
    if scale == 0.0:
        return math.inf if moved > 0 else (-math.inf if moved < 0 else 0.0)
    return moved / scale


def _status(worse: float) -> Status:
    # The edge itself is within: "more than 10 %" (the epsilon absorbs 0.1's rounding).
    edge = TOLERANCE * (1 + 1e-9)
    return "regressed" if worse > edge else "improved" if -worse > edge else "steady"


def judge(
    benchmark: str, baseline: Mapping[str, Mapping[str, Any]], measured: Sequence[Mapping[str, Any]]
) -> list[Verdict]:
    """Each measured figure (``Figure.as_dict``) against ``baseline`` (name -> {value, unit,
    better, clock}), then every baseline figure the run did not measure."""
    has_cpu = any(f.get("clock") == "cpu" for f in measured)
    out: list[Verdict] = []
    for f in measured:
        name, unit = str(f.get("name")), str(f.get("unit", ""))
        value, base = _finite(f.get("value")), baseline.get(name)
        if value is None:
            out.append(Verdict(benchmark, name, "invalid", unit, why=f"no finite value ({f.get('value')!r})"))
        elif base is None:
            out.append(Verdict(benchmark, name, "new", unit, value=value, why="no baseline figure"))
        elif (b := _finite(base.get("value"))) is None:
            out.append(
                Verdict(benchmark, name, "invalid", unit, value=value, why="baseline value not finite")
            )
        elif str(base.get("unit", "")) != unit:
            why = f"unit changed: {base.get('unit')!r} -> {unit!r}"
            out.append(Verdict(benchmark, name, "invalid", unit, b, value, why=why))
        elif has_cpu and f.get("clock") == "wall":
            why = "wall clock: its benchmark's CPU-time figures are judged instead"
            out.append(Verdict(benchmark, name, "unguarded", unit, b, value, why=why))
        else:
            w = worse_by(b, value, unit, str(base.get("better", direction(f))))
            out.append(Verdict(benchmark, name, _status(w), unit, b, value, w))
    seen = {str(f.get("name")) for f in measured}
    out += [
        Verdict(
            benchmark, n, "unmeasured", str(e.get("unit", "")), _finite(e.get("value")), why="not measured"
        )
        for n, e in baseline.items()
        if n not in seen
    ]
    return out


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.4g}"


def _pct(w: float | None) -> str:
    return "n/a" if w is None else ("from zero" if math.isinf(w) else f"{100 * abs(w):.1f} %")


def _moved(v: Verdict, word: str) -> str:
    return f"{v.benchmark}: {v.name}: {_num(v.baseline)} -> {_num(v.value)} {v.unit} ({_pct(v.worse)} {word})"


def report(verdicts: Sequence[Verdict], notes: Sequence[str] = ()) -> list[str]:
    """The lines ``python -m bench`` ends with: the rest in brief, the REGRESSED block last."""
    lines = [f"  improved: {_moved(v, 'better')}" for v in verdicts if v.status == "improved"]
    for status in ("new", "unmeasured", "unguarded", "invalid"):
        names = [f"{v.benchmark}: {v.name}" + (f" ({v.why})" if status == "invalid" else "") for v in verdicts
                 if v.status == status]  # fmt: skip
        if names:
            lines.append(f"  {status} ({len(names)}): " + "; ".join(names))
    lines += [f"  note: {n}" for n in notes]
    bad = [v for v in verdicts if v.status == "regressed"]
    judged = sum(v.status in ("steady", "improved", "regressed") for v in verdicts)
    if not bad:
        return [*lines, f"no regression: {judged} figure(s) judged, none {100 * TOLERANCE:.0f} % worse"]
    return [
        *lines,
        f"REGRESSED: {len(bad)} of {judged} figure(s) moved more than {100 * TOLERANCE:.0f} % the wrong way:",
        *(f"  {_moved(v, 'worse')}" for v in bad),
    ]


# --- the files ---------------------------------------------------------------------------


def load(path: Path = BASELINE) -> dict[str, Any]:
    """The baseline document; an empty one where the file is absent."""
    if not path.is_file():
        return {"quick": {}, "full": {}}
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    return doc


def check(doc: Mapping[str, Any], results: Iterable[Mapping[str, Any]]) -> tuple[list[Verdict], list[str]]:
    """Every result document (``bench/results/<name>.json``) against the baseline of its size."""
    verdicts: list[Verdict] = []
    notes: list[str] = []
    for r in results:
        name, sz = str(r["benchmark"]), size(bool(r.get("quick")))
        entry = doc.get(sz, {}).get(name)
        if entry is None:
            other = "full" if sz == "quick" else "quick"
            also = f" (a {other} one exists: sizes are not compared)" if name in doc.get(other, {}) else ""
            notes.append(f"{name}: no {sz} baseline{also}; not compared")
            continue
        verdicts += judge(name, entry.get("figures", {}), r.get("figures", []))
    return verdicts, notes


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "commit": _commit(),
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
    }


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    dirty = subprocess.run(
        ["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10, check=False,
    ).stdout.strip()  # fmt: skip
    return "unknown" if out.returncode else out.stdout.strip() + ("+changes" if dirty else "")


def entry(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result document as its baseline entry: where it was measured, and each finite figure."""
    measured = dict(result.get("measured") or {})
    quick = " --quick" if result.get("quick") else ""
    measured.setdefault("command", f"python -m bench{quick} {result['benchmark']}")
    measured.setdefault("python", result.get("python"))
    measured.setdefault("machine", result.get("machine"))
    measured.setdefault("seconds", result.get("seconds"))
    figures = {
        str(f["name"]): {
            "value": f["value"],
            "unit": f.get("unit", ""),
            "better": direction(f),
            **({"clock": f["clock"]} if f.get("clock") else {}),
        }
        for f in result.get("figures", [])
        if _finite(f.get("value")) is not None
    }
    return {"measured": measured, "figures": figures}


def update(doc: dict[str, Any], results: Iterable[Mapping[str, Any]]) -> list[str]:
    """Record ``results`` in ``doc`` (each replaces its benchmark's entry of its size); what changed."""
    done = []
    for r in results:
        sz = size(bool(r.get("quick")))
        doc.setdefault(sz, {})[str(r["benchmark"])] = entry(r)
        done.append(f"{sz} {r['benchmark']}")
    return done


def save(doc: Mapping[str, Any], path: Path = BASELINE) -> None:
    ordered = {k: dict(sorted(doc.get(k, {}).items())) for k in ("full", "quick")}
    rest = {k: v for k, v in doc.items() if k not in ordered}
    path.write_text(json.dumps({**rest, **ordered}, indent=2) + "\n", encoding="utf-8")


def read_results(directory: Path, names: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The result documents in ``directory`` (those named, or every ``bench_*.json``)."""
    paths = [directory / f"{n}.json" for n in names] if names else sorted(directory.glob("bench_*.json"))
    docs = []
    for p in paths:
        doc = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and "benchmark" in doc and "figures" in doc:
            docs.append(doc)
    return docs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.baseline",
        description="Compare the results in bench/results with the committed baseline, or record them as it.",
    )
    parser.add_argument("names", nargs="*", help="benchmarks (default: every bench/results/bench_*.json)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory of the result JSON files")
    parser.add_argument(
        "--baseline", type=Path, default=BASELINE, help="the baseline file (bench/baseline.json)"
    )
    parser.add_argument(
        "--update", action="store_true", help="record the results as the baseline (commit it saying why)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a figure regressed")
    args = parser.parse_args(argv)
    try:
        results = read_results(args.results, args.names)
        doc = load(args.baseline)
    except (OSError, ValueError) as exc:
        print(f"python -m bench.baseline: {exc}", file=sys.stderr)
        return 2
    if args.update:
        for line in update(doc, results):
            print(f"baseline: recorded {line}")
        save(doc, args.baseline)
        return 0
    verdicts, notes = check(doc, results)
    print("\n".join(report(verdicts, notes)))
    return 1 if args.strict and any(v.status == "regressed" for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
