"""Where the suite's time goes: a JUnit report's test times summed by folder and by the real
infrastructure each test starts (docs/development.md shows the tables).

    .venv/bin/pytest -n 4 --dist loadgroup --junitxml=build/suite.xml
    .venv/bin/python -m tests.suite_times build/suite.xml [--slowest 15] [--markdown]

Every test carries its kind as the JUnit property ``infra`` (tests/conftest.py). A report from a
run without it (an older commit) is matched against this checkout's collection instead.
"""

from __future__ import annotations

import argparse
import json
import os
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
# What a test starts, judged from its fixtures and its file, the heaviest first: the heavy
# fixtures are the xdist groups' own (tests/parallel.py), named for people here.
_LABELS = {"real_nodes": "real nodes", "kube": "kube-apiserver", "docker_engines": "Docker engines"}
KINDS: tuple[tuple[str, frozenset[str]], ...] = (
    *((_LABELS[group], members) for group, members in HEAVY_FIXTURES),
    ("browser", frozenset({"chromium"})),
    ("network hosts", frozenset({"net_hosts"})),
)


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


def read_report(path: Path) -> list[Case]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        file = tc.get("file") or tc.get("classname", "").replace(".", "/") + ".py"
        nodeid = f"{file}::{tc.get('name')}"
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        outcome = "skipped" if tc.find("skipped") is not None else "passed"
        if tc.find("failure") is not None or tc.find("error") is not None:
            outcome = "failed"
        cases.append(Case(nodeid, float(tc.get("time") or 0.0), props.get("infra"), outcome))
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


def table(title: str, rows: dict[str, list[Case]], total: float, markdown: bool) -> str:
    head = f"| {title} | tests | seconds | share | slowest test (s) |"
    lines = [head, "|---|---:|---:|---:|---|"] if markdown else [head]
    for name, cases in sorted(rows.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        secs = sum(c.seconds for c in cases)
        worst = max(cases, key=lambda c: c.seconds)
        lines.append(
            f"| {name} | {len(cases)} | {secs:,.0f} | {secs / total:.0%} | "
            f"{worst.nodeid.split('::', 1)[1][:60]} ({worst.seconds:.0f}) |"
        )
    lines.append(f"| all | {sum(len(c) for c in rows.values())} | {total:,.0f} | 100% | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("report", type=Path, help="a pytest --junitxml report")
    p.add_argument("--slowest", type=int, default=15, help="also list the N slowest tests (default 15)")
    p.add_argument("--markdown", action="store_true", help="Markdown tables")
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
    print(f"\n{len(cases)} tests, {total:,.0f} s of test time, {len(failed)} failed")
    if args.slowest:
        print(f"\nThe {args.slowest} slowest:")
        for c in sorted(cases, key=lambda c: -c.seconds)[: args.slowest]:
            print(f"  {c.seconds:7.1f} s  {c.nodeid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
