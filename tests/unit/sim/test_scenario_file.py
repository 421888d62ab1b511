"""``specon sim --scenario FILE``: a user's own cluster, its checks, and the CLI end to end."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import pytest

from specon.cli.main import main
from specon.model import WorkerId
from specon.policy.loss_curve import CurveParams
from specon.sim.cluster import SimParams, WorkerSpec
from specon.sim.curves import synthetic_trace
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.scenario_file import FileWorkload, ScenarioFileError, load_scenario, parse_scenario
from specon.sim.scenarios import SCENARIOS
from specon.sim.trace import Trace, load_traces, write_trace_file

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
HEAD = "apiVersion: specon/v1alpha1\nkind: Scenario\nname: mine\n"


def _trace(model: str, step_cost: float = 0.01, seed: int = 0) -> Trace:
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    return synthetic_trace(model=model, steps=200, step_cost=step_cost, params=params, noise=0.01, seed=seed)


@pytest.fixture
def traces() -> dict[str, list[Trace]]:
    # gru has two traces: a seed picks one per job.
    return {"vae": [_trace("vae", 0.01)], "gru": [_trace("gru", 0.02, 0), _trace("gru", 0.03, 1)]}


def _parse(body: str, traces: dict[str, list[Trace]], base_dir: Path = Path()) -> FileWorkload:
    sc = parse_scenario(HEAD + textwrap.dedent(body), traces, base_dir=base_dir)
    assert isinstance(sc.plan, FileWorkload)
    return sc.plan


def _errors(body: str, traces: dict[str, list[Trace]], head: str = HEAD) -> list[str]:
    with pytest.raises(ScenarioFileError) as info:
        parse_scenario(head + textwrap.dedent(body), traces, base_dir=Path())
    return list(info.value.errors)


def test_an_explicit_job_list_becomes_the_workload(traces: dict[str, list[Trace]]) -> None:
    text = HEAD + textwrap.dedent("""\
        description: two workers
        workers: [{name: big-1, cpu: 2}, {name: small-1}]
        jobs:
          - {submit: 0, model: vae, steps: 1200}
          - {submit: 35.5, model: gru, steps: 800, worker: big-1, id: the-gru}
          - {submit: 10, model: vae, steps: 7}
        """)
    sc = parse_scenario(text, traces, base_dir=Path())
    assert (sc.name, sc.title, sc.paper.given) == ("mine", "two workers", False)
    assert (sc.alpha, sc.interval) == (0.01, 30.0)  # the built-ins' defaults; --alpha/--interval override
    wl = sc.workload(0, traces)
    assert wl.workers == (WorkerSpec(WorkerId("big-1"), 2.0), WorkerSpec(WorkerId("small-1"), 1.0))
    jobs = {j.id: j for j in wl.jobs}
    assert [j.id for j in wl.jobs] == ["job-1", "job-3", "the-gru"]  # by submit time
    assert (jobs["job-1"].steps, jobs["job-1"].step_cost) == (1200, 0.01)
    assert jobs["job-1"].work == pytest.approx(12.0)  # steps x the trace's step_cost
    assert (jobs["the-gru"].model, jobs["the-gru"].submit, jobs["the-gru"].worker) == ("gru", 35.5, "big-1")
    assert jobs["the-gru"].step_cost in (0.02, 0.03)  # one of gru's traces, as measured
    assert jobs["job-3"].worker is None  # round-robin
    assert sc.workload(0, traces) == wl
    # Without a description, the title says what is there.
    assert parse_scenario(text.replace("description: two workers\n", ""), traces, base_dir=Path()).title == (
        "3 jobs on 2 workers (3 cores)"
    )


def test_a_generator_draws_one_workload_per_seed(traces: dict[str, list[Trace]]) -> None:
    text = HEAD + textwrap.dedent("""\
        workers: [{name: a}]
        jobs: {count: 12, models: [vae, gru], arrivals: {uniform: [5, 600]}, steps: [40, 90]}
        """)
    sc = parse_scenario(text, traces, base_dir=Path())
    w0, w1 = sc.workload(0, traces), sc.workload(1, traces)
    assert w0 == parse_scenario(text, traces, base_dir=Path()).workload(0, traces)
    assert w0 != w1
    for wl in (w0, w1):
        assert [j.id for j in wl.jobs] == [f"job-{i:02d}" for i in range(1, 13)]
        assert {j.model for j in wl.jobs} <= {"vae", "gru"}
        assert all(40 <= j.steps <= 90 and 5 <= j.submit <= 600 for j in wl.jobs)
        assert wl.jobs[0].submit == 5.0  # the first job arrives at lo


@pytest.mark.parametrize(
    ("arrivals", "times"),
    [
        ("{fixed: {every: 50, start: 10}}", [10.0, 60.0, 110.0]),
        ("{fixed: {every: 0}}", [0.0, 0.0, 0.0]),  # a burst
        ("{poisson: {rate: 0.1, start: 7}}", None),
    ],
)
def test_fixed_and_poisson_arrivals(
    traces: dict[str, list[Trace]], arrivals: str, times: list[float] | None
) -> None:
    plan = _parse(
        f"workers: [{{name: a}}]\njobs: {{count: 3, models: [vae], arrivals: {arrivals}, steps: 9}}\n", traces
    )
    wl = plan.workload(random.Random(0), traces, "test")
    submits = [j.submit for j in wl.jobs]
    assert submits == times if times is not None else submits[0] == 7.0 and submits == sorted(submits)
    assert all(j.steps == 9 for j in wl.jobs)


def test_heterogeneous_workers_run_at_their_own_capacity(traces: dict[str, list[Trace]]) -> None:
    # Two jobs on the 2-core worker each get a full core (job_cores = 1); two on the 1-core
    # worker share it, so they take twice as long.
    plan = _parse(
        """\
        workers: [{name: big, cpu: 2}, {name: small, cpu: 1}]
        jobs:
          - {submit: 0, model: vae, steps: 1000, worker: big, id: b1}
          - {submit: 0, model: vae, steps: 1000, worker: big, id: b2}
          - {submit: 0, model: vae, steps: 1000, worker: small, id: s1}
          - {submit: 0, model: vae, steps: 1000, worker: small, id: s2}
          - {submit: 100, model: vae, steps: 1000, worker: big, id: alone}
        """,
        traces,
    )
    run = simulate(plan.workload(random.Random(0), traces, "test"), make_policy("ds"), params=SimParams())
    jct = {j.id: j.jct for j in run.jobs}
    assert jct["b1"] == pytest.approx(10.0) and jct["b2"] == pytest.approx(10.0)
    assert jct["s1"] == pytest.approx(20.0) and jct["s2"] == pytest.approx(20.0)
    assert jct["alone"] == pytest.approx(10.0)  # alone on 2 cores: still one core's speed


def test_every_problem_is_reported_at_once_with_its_path(traces: dict[str, list[Trace]]) -> None:
    head = "apiVersion: specon/v2\nkind: Policy\nname: ''\n"
    errors = _errors(
        """\
        descripton: typo
        workers:
          - {name: big-1, cpu: 0}
          - {name: big-1, cpus: 2}
        jobs:
          - {submit: -1, model: vea, steps: 10}
          - {submit: 3, model: gru, steps: -3, worker: big-2}
          - {model: nope.json, steps: 1.5, id: job-1}
          - {submit: soon, model: 7, steps: many}
          - 12
        """,
        traces,
        head=head,
    )
    assert errors == [
        "apiVersion: unsupported 'specon/v2'; expected 'specon/v1alpha1'",
        "kind: must be 'Scenario', got 'Policy'",
        "name: must not be empty",
        "descripton: unknown key; did you mean 'description'?",
        "workers[0].cpu: must be > 0, got 0",
        "workers[1].name: duplicate worker name 'big-1'",
        "workers[1].cpus: unknown key; did you mean 'cpu'?",
        "jobs[0].submit: must be >= 0, got -1",
        "jobs[0].model: unknown model 'vea'; did you mean 'vae'? (known: gru, vae; or the path of a "
        "trace JSON file)",
        "jobs[1].steps: must be an integer >= 1, got -3",
        "jobs[1].worker: unknown worker 'big-2'; did you mean 'big-1'?",
        f"jobs[2].model: trace file 'nope.json': no such file: {Path('nope.json').resolve()}",
        "jobs[2].steps: must be an integer >= 1, got 1.5",
        "jobs[2].id: duplicate job id 'job-1'",
        "jobs[2].submit: missing",
        "jobs[3].submit: expected a number, got string 'soon'",
        "jobs[3].model: expected a string, got integer 7",
        "jobs[3].steps: must be an integer >= 1, got string 'many'",
        "jobs[4]: expected a mapping, got integer 12",
    ]


def _gen(
    count: str = "2", models: str = "[vae]", arrivals: str = "{uniform: [0, 1]}", steps: str = "steps: 5"
) -> str:
    return (
        f"workers: [{{name: a}}]\njobs: {{count: {count}, models: {models}, arrivals: {arrivals}, {steps}}}\n"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("workers: []\njobs: [{submit: 0, model: vae, steps: 1}]\n", "workers: must not be empty"),
        ("workers: [{name: a}]\njobs: []\n", "jobs: must not be empty"),
        ("workers: [{name: a}]\njobs: vae\n", "jobs: expected a list of jobs or a generator mapping"),
        ("workers: [{name: a}]\n", "jobs: missing"),
        ("workers: [{name: ' '}]\njobs: []\n", "workers[0].name: must not be empty"),
        (_gen(count="0"), "jobs.count: must be an integer >= 1, got 0"),
        (_gen(models="[]"), "jobs.models: must not be empty"),
        (_gen(models="[vae, gur]"), "jobs.models[1]: unknown model 'gur'; did you mean 'gru'?"),
        (_gen(arrivals="{uniform: [9, 1]}"), "jobs.arrivals.uniform: lo must be <= hi, got [9, 1]"),
        (_gen(arrivals="{uniform: [-1, 1]}"), "jobs.arrivals.uniform[0]: must be >= 0, got -1"),
        (_gen(arrivals="{}"), "jobs.arrivals: expected exactly one of uniform, fixed, poisson"),
        (_gen(arrivals="{uniform: [0, 1], fixed: {every: 1}}"), "(got uniform, fixed)"),
        (_gen(arrivals="{fixed: {evry: 3}}"), "jobs.arrivals.fixed.evry: unknown key; did you mean 'every'?"),
        (_gen(arrivals="{fixed: {start: 3}}"), "jobs.arrivals.fixed.every: missing"),
        (_gen(arrivals="{poisson: {rate: 0}}"), "jobs.arrivals.poisson.rate: must be > 0, got 0"),
        (_gen(steps="steps: [9, 2]"), "jobs.steps: lo must be <= hi, got [9, 2]"),
        (_gen(steps="steps: [0, 2]"), "jobs.steps[0]: must be an integer >= 1, got 0"),
        (_gen(steps="steps: [1, 2, 3]"), "jobs.steps: expected an integer or a range [lo, hi]"),
        (_gen(steps="stepz: 5"), "jobs.stepz: unknown key; did you mean 'steps'?"),
    ],
)
def test_each_problem_names_its_path(traces: dict[str, list[Trace]], body: str, message: str) -> None:
    assert any(message in e for e in _errors(body, traces)), _errors(body, traces)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty scenario; it needs apiVersion, kind, name, workers, jobs"),
        ("[1, 2]", "(top level): expected a mapping, got list"),
        ("a: [\n", "invalid YAML"),
        ("kind: Scenario\n", "apiVersion: missing; expected 'specon/v1alpha1'"),
    ],
)
def test_unreadable_files_say_why(traces: dict[str, list[Trace]], text: str, message: str) -> None:
    with pytest.raises(ScenarioFileError) as info:
        parse_scenario(text, traces, base_dir=Path())
    assert any(message in e for e in info.value.errors), info.value.errors


def test_a_model_may_be_a_trace_file_next_to_the_scenario(
    traces: dict[str, list[Trace]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mine").mkdir()
    write_trace_file(tmp_path / "mine" / "bert.json", _trace("bert", step_cost=0.5))
    (tmp_path / "mine" / "broken.json").write_text('{"model": "x"}')
    path = tmp_path / "scenario.json"  # JSON is read too
    doc = {
        "apiVersion": "specon/v1alpha1",
        "kind": "Scenario",
        "name": "files",
        "workers": [{"name": "w", "cpu": 1}],
        "jobs": [
            {"submit": 0, "model": "mine/bert.json", "steps": 30},
            {"submit": 1, "model": "vae", "steps": 3},
        ],
    }
    path.write_text(json.dumps(doc))
    monkeypatch.chdir(tmp_path / "mine")  # relative to the scenario file, not to the working directory
    wl = load_scenario(path, traces).workload(0, traces)
    bert = wl.jobs[0]
    assert (bert.model, bert.steps, bert.step_cost, bert.work) == ("bert", 30, 0.5, 15.0)
    doc["jobs"] = [{"submit": 0, "model": "mine/broken.json", "steps": 3}]
    path.write_text(json.dumps(doc))
    with pytest.raises(
        ScenarioFileError, match=r"jobs\[0\]\.model: trace file 'mine/broken.json': trace is missing"
    ):
        load_scenario(path, traces)


def test_the_examples_load_with_the_packaged_traces() -> None:
    traces = load_traces()
    mixed = load_scenario(EXAMPLES / "scenario.yaml", traces)
    wl = mixed.workload(0, traces)
    assert len({w.cpu for w in wl.workers}) > 1  # heterogeneous
    assert any(j.worker is not None for j in wl.jobs)
    generated = load_scenario(EXAMPLES / "scenario-generated.yaml", traces)
    assert generated.workload(0, traces) != generated.workload(1, traces)


# --- the CLI --------------------------------------------------------------------------


@pytest.fixture
def trace_dir(tmp_path: Path, traces: dict[str, list[Trace]]) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    for model, ts in traces.items():
        write_trace_file(d / f"{model}.json", ts)
    return d


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(HEAD + textwrap.dedent(body))
    return path


def test_cli_runs_a_scenario_file(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path,
        "s.yaml",
        """\
        workers: [{name: big, cpu: 2}, {name: small, cpu: 1}]
        jobs: {count: 6, models: [vae, gru], arrivals: {uniform: [0, 20]}, steps: [500, 1500]}
        """,
    )
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    args = ["sim", "--scenario", str(path), "--seeds", "2", "--policy", "specon", "--traces", str(trace_dir),
            "--json", str(out), "--markdown", str(md), "--quiet"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert (data["scenario"], data["title"]) == ("mine", "6 generated jobs (vae, gru) on 2 workers (3 cores)")
    assert (data["seeds"], data["paper"], data["scenario_file"]) == (2, None, str(path))
    assert set(data["policies"]) == {"ds", "specon"} and data["policies"]["ds"]["avg_jct"] > 0
    table = capsys.readouterr().out
    assert table.startswith("### mine: 6 generated jobs") and "paper" not in table
    assert md.read_text() == table


def test_cli_reports_a_bad_scenario_file_and_exits_2(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(
        tmp_path, "bad.yaml", "workers: [{name: a, cpu: -1}]\njobs: [{submit: 0, model: vea, steps: -3}]\n"
    )
    assert main(["sim", "--scenario", str(path), "--traces", str(trace_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"specon sim: {path}: 3 errors" in err
    for message in ("workers[0].cpu: must be > 0, got -1", "jobs[0].model: unknown model 'vea'",
                    "jobs[0].steps: must be an integer >= 1, got -3"):  # fmt: skip
        assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--scenario", "A9"], "'A9' is neither a built-in scenario (A1, A2, A3, A4, A5) nor a file"),
        (["--scenario", "{good}", "--arrivals", "{good}"], "--arrivals: a scenario file lists its own jobs"),
    ],
)
def test_cli_usage_errors_exit_2(
    trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    good = _write(tmp_path, "good.yaml", "workers: [{name: a}]\njobs: [{submit: 0, model: vae, steps: 5}]\n")
    args = [a.format(good=good) for a in extra]
    assert main(["sim", *args, "--traces", str(trace_dir), "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_a_built_in_name_wins_over_a_file(
    trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a1").write_text("not a scenario")
    out = tmp_path / "a1.json"
    args = ["sim", "--scenario", "a1", "--seeds", "1", "--policy", "ds", "--traces", str(trace_dir),
            "--json", str(out), "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert json.loads(out.read_text())["scenario"] == "A1" == SCENARIOS["A1"].name
