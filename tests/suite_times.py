"""Where the suite's time goes: a JUnit report's test times, and the CPU each test used, summed
by folder and by the real infrastructure each test starts (docs/development.md shows the tables).

    .venv/bin/pytest -n 4 --dist loadgroup --junitxml=build/suite.xml
    .venv/bin/python -m tests.suite_times build/suite.xml [--slowest 15] [--markdown]

Every test carries its kind as the JUnit property ``infra`` and the CPU seconds it used as
``cpu_seconds`` (tests/conftest.py). A report from a run without the kinds (an older commit) is
matched against this checkout's collection instead. On a 2-core machine the suite is bound by
the CPU, not by waiting: the CPU column says where time can be won.

The CPU of a test is its worker's and the worker's children that ended during the test (jobs,
daemons, agents and managers it started and stopped, and what they started and waited for);
a session fixture's processes count where they are stopped, and what a Docker engine or a
kubelet runs (containers, pods) is not the worker's child and is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.parallel import HEAVY_FIXTURES

ROOT = Path(__file__).resolve().parents[1]
INFRA_OUT_ENV = "SPECON_SUITE_INFRA_OUT"
CPU_PROPERTY = "cpu_seconds"
# What a test starts, judged from its fixtures and its file, the heaviest first: the heavy
# fixtures are the xdist groups' own (tests/parallel.py), named for people here.
_LABELS = {"real_nodes": "real nodes", "kube": "kube-apiserver", "docker_engines": "Docker engines"}
KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    *((_LABELS[group], members) for group, members in HEAVY_FIXTURES),
    ("browser", frozenset({"chromium"})),
    ("network hosts", frozenset({"net_hosts"})),
)


def cpu_seconds_used() -> float:
    """User and system CPU seconds of this process and its ended (waited-for) children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def infra_of(fixtures: Iterable[str], path: str) -> str:
    """The kind of a test (``path``: its file, relative to the repository)."""
    used = set(fixtures)
    for name, members in KINDS:
        if used & members:
            return name
    folder = path.split("/")[1] if path.count("/") >= 2 else ""
    if folder == "docker":
        return "Docker engines"  # the tests that start engines of their own
    if "frameworks" in Path(path).name:
        return "framework jobs"
    if folder in ("integration", "k8s"):
        return "processes"
    return "unit"


@dataclass
class Case:
    nodeid: str
    seconds: float
    infra: str | None
    outcome: str
    cpu: float | None = None  # None: a report without the property


def read_report(path: Path) -> list[Case]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        file = tc.get("file") or tc.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{file}::{tc.get('name')}"
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        outcome = "skipped" if tc.find("skipped") is not None else "passed"
        if tc.find("failure") is not None or tc.find("error") is not None:
            outcome = "failed"
        cpu = props.get(CPU_PROPERTY)
        seconds = float(tc.get("time") or 0.0)
        cases.append(Case(nodeid, seconds, props.get("infra"), outcome, None if cpu is None else float(cpu)))
    return cases


def collected_infra() -> dict[str, str]:
    """nodeid -> kind, from collecting this checkout (for reports that lack the property)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "infra.json"
        env = dict(os.environ, **{INFRA_OUT_ENV: str(out)})
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"]
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
        mapping: dict[str, str] = json.loads(out.read_text())
    return mapping


def _key(nodeid: str) -> str:
    # JUnit names a test by class path and name; compare on file stem and test name.
    file, _, name = nodeid.partition("::")
    return f"{Path(file).stem}::{name.rsplit('::', 1)[-1]}"


def cpu_of(cases: Iterable[Case]) -> float:
    return sum(c.cpu or 0.0 for c in cases)


def table(title: str, rows: dict[str, list[Case]], total: float, markdown: bool) -> str:
    """Test time and share per row; CPU seconds and share too where the report has them."""
    everything = [c for cases in rows.values() for c in cases]
    with_cpu = any(c.cpu is not None for c in everything)
    total_cpu = cpu_of(everything) or 1.0
    cpu_head = " CPU s | CPU share |" if with_cpu else ""
    head = f"| {title} | tests | seconds | share |{cpu_head} slowest test (s) |"
    rule = "|---|---:|---:|---:|" + ("---:|---:|" if with_cpu else "") + "---|"
    lines = [head, rule] if markdown else [head]
    for name, cases in sorted(rows.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        secs = sum(c.seconds for c in cases)
        worst = max(cases, key=lambda c: c.seconds)
        cpu = f" {cpu_of(cases):,.0f} | {cpu_of(cases) / total_cpu:.0%} |" if with_cpu else ""
        lines.append(
            f"| {name} | {len(cases)} | {secs:,.0f} | {secs / total:.0%} |{cpu} "
            f"{worst.nodeid.split('::', 1)[1][:60]} ({worst.seconds:.0f}) |"
        )
    cpu = f" {cpu_of(everything):,.0f} | 100% |" if with_cpu else ""
    lines.append(f"| all | {len(everything)} | {total:,.0f} | 100% |{cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("report", type=Path, help="a pytest --junitxml report")
    p.add_argument("--slowest", type=int, default=15, help="also list the N slowest tests (default 15)")
    p.add_argument("--markdown", action="store_true", help="Markdown tables")
    p.add_argument("--by-cpu", action="store_true", help="list the tests that used most CPU, not the slowest")
    args = p.parse_args(argv)
    cases = read_report(args.report)
    if not cases:
        print(f"{args.report}: no test cases", file=sys.stderr)
        return 1
    if any(c.infra is None for c in cases):
        mapping = {_key(k): v for k, v in collected_infra().items()}
        for c in cases:
            c.infra = c.infra or mapping.get(_key(c.nodeid), "unknown (not in this checkout)")
    total = sum(c.seconds for c in cases)
    by_folder: dict[str, list[Case]] = defaultdict(list)
    by_infra: dict[str, list[Case]] = defaultdict(list)
    for c in cases:
        parts = c.nodeid.split("::")[0].split("/")
        by_folder["/".join(parts[:2]) if len(parts) > 2 else parts[0]].append(c)
        by_infra[c.infra or "unknown"].append(c)
    print(table("folder", by_folder, total, args.markdown))
    print()
    print(table("what the test starts", by_infra, total, args.markdown))
    failed = [c for c in cases if c.outcome == "failed"]
    cpu = f", {cpu_of(cases):,.0f} CPU s" if any(c.cpu is not None for c in cases) else ""
    print(f"\n{len(cases)} tests, {total:,.0f} s of test time{cpu}, {len(failed)} failed")
    if args.slowest:
        what = "most CPU" if args.by_cpu else "slowest"
        print(f"\nThe {args.slowest} {what} (test s, CPU s):")
        key = (lambda c: -(c.cpu or 0.0)) if args.by_cpu else (lambda c: -c.seconds)
        for c in sorted(cases, key=key)[: args.slowest]:
            cpu_s = "-" if c.cpu is None else f"{c.cpu:.1f}"
            print(f"  {c.seconds:7.1f} {cpu_s:>7}  {c.nodeid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
