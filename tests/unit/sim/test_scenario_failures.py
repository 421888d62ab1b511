"""A scenario file's ``failures:`` section, and ``specon sim --mtbf`` on any scenario."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from specon.cli.main import main
from specon.model import WorkerId
from specon.policy.loss_curve import CurveParams
from specon.sim.curves import synthetic_trace
from specon.sim.failures import Checkpoints, Failures, HostEvent
from specon.sim.scenario_file import ScenarioFileError, parse_scenario
from specon.sim.scenarios import scenario
from specon.sim.trace import Trace, write_trace_file

HEAD = textwrap.dedent("""\
    apiVersion: specon/v1alpha1
    kind: Scenario
    name: mine
    workers: [{name: big-1, cpu: 2}, {name: small-1}]
    jobs: [{submit: 0, model: vae, steps: 3000}, {submit: 5, model: vae, steps: 2000}]
    """)


@pytest.fixture
def traces() -> dict[str, list[Trace]]:
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    vae = synthetic_trace(model="vae", steps=200, step_cost=0.05, params=params, noise=0.01, seed=0)
    return {"vae": [vae]}


def _failures(body: str, traces: dict[str, list[Trace]]) -> Failures | None:
    return parse_scenario(HEAD + textwrap.dedent(body), traces, base_dir=Path()).failures


def _errors(body: str, traces: dict[str, list[Trace]]) -> list[str]:
    with pytest.raises(ScenarioFileError) as info:
        parse_scenario(HEAD + textwrap.dedent(body), traces, base_dir=Path())
    return list(info.value.errors)


def test_failures_read_with_their_defaults(traces: dict[str, list[Trace]]) -> None:
    assert _failures("", traces) is None
    assert _failures("failures: {mtbf: 7200}\n", traces) == Failures(mtbf=7200.0)
    got = _failures(
        """\
        failures:
          repair: 30
          checkpoint_every: 50
          checkpoint_interval: 10
          events:
            - {worker: big-1, at: 1800}
            - {worker: small-1, at: 3600, notice: 120}
        """,
        traces,
    )
    events = (HostEvent(WorkerId("big-1"), 1800.0), HostEvent(WorkerId("small-1"), 3600.0, 120.0))
    assert got == Failures(None, 30.0, events, Checkpoints(50, 10.0))
    assert Failures().repair == 600 and Checkpoints() == Checkpoints(200, 60.0)  # jobkit's schedule


def test_every_problem_of_the_section_is_reported_with_its_path(traces: dict[str, list[Trace]]) -> None:
    errors = _errors(
        """\
        failures:
          mtbf: -3
          repair: 0
          checkpoint_every: 1.5
          checkpoint_interval: soon
          evnts: []
          events:
            - {worker: big-2, at: -1}
            - {worker: small-1, at: 5, notice: 0}
            - {at: 5}
            - 7
        """,
        traces,
    )
    assert errors == [
        "failures.mtbf: must be > 0, got -3",
        "failures.repair: must be > 0, got 0",
        "failures.checkpoint_every: must be an integer >= 1, got 1.5",
        "failures.checkpoint_interval: expected a number, got string 'soon'",
        "failures.evnts: unknown key; did you mean 'events'?",
        "failures.events[0].worker: unknown worker 'big-2'; did you mean 'big-1'?",
        "failures.events[0].at: must be >= 0, got -1",
        "failures.events[1].notice: must be > 0, got 0",
        "failures.events[2].worker: missing",
        "failures.events[3]: expected a mapping, got integer 7",
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("failures: {}\n", "failures: needs mtbf (seconds), events (a list), or both"),
        ("failures: 7200\n", "failures: expected a mapping, got integer 7200"),
        ("failures: {events: {worker: big-1}}\n", "failures.events: expected a list of {worker, at"),
    ],
)
def test_a_malformed_section_says_why(traces: dict[str, list[Trace]], body: str, message: str) -> None:
    assert any(message in e for e in _errors(body, traces)), _errors(body, traces)


def test_mtbf_applies_to_a_built_in_scenario_and_keeps_its_workloads() -> None:
    a3 = scenario("A3")
    failing = a3.with_failures(mtbf=7200.0)
    assert failing.failures == Failures(mtbf=7200.0) and a3.failures is None
    assert failing.with_failures(repair=60.0).failures == Failures(mtbf=7200.0, repair=60.0)


@pytest.fixture
def trace_dir(tmp_path: Path, traces: dict[str, list[Trace]]) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    write_trace_file(d / "vae.json", traces["vae"])
    return d


def test_cli_prints_and_writes_the_lost_work(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + "failures: {events: [{worker: big-1, at: 25}]}\n")
    out = tmp_path / "s.json"
    args = ["sim", "--scenario", str(path), "--seeds", "1", "--policy", "specon", "--traces", str(trace_dir),
            "--json", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "Host failures: 1 listed event (0 notices)" in table
    assert "| policy | hosts lost | jobs hit | steps lost | CPU-s lost | recoveries |" in table
    data = json.loads(out.read_text())
    assert data["failures"]["events"] == [{"worker": "big-1", "at": 25.0, "notice": None}]
    for name in ("ds", "specon"):
        got = data["policies"][name]
        assert (got["hosts_lost"], got["jobs_lost"], got["recoveries"]) == (1, 1, 1)
    assert data["policies"]["ds"]["lost_steps"] > data["policies"]["specon"]["lost_steps"] >= 0
    # --mtbf replaces the file's MTBF (the file gave none): a second source of failures.
    assert main([*args, "--mtbf", "1e9"]) == 0
    assert json.loads(out.read_text())["failures"]["mtbf"] == 1e9


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mtbf", "-3"], "--mtbf must be a number of seconds > 0, got -3"),
        (["--repair", "60"], "--repair: the scenario has no failures; give --mtbf too"),
    ],
)
def test_cli_rejects_bad_failure_options(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(HEAD)
    assert main(["sim", "--scenario", str(path), "--traces", str(trace_dir), "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err
