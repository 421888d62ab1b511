"""``specon sim``: the JSON contract, the table, bad input, and run-to-run determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specon.cli.main import main
from specon.policy.loss_curve import CurveParams
from specon.sim.curves import synthetic_trace
from specon.sim.policies import POLICIES
from specon.sim.scenarios import PAPER_MODELS
from specon.sim.trace import write_trace_file


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    for m in PAPER_MODELS:
        t = synthetic_trace(model=m, steps=1000, step_cost=0.02, params=params, noise=0.01, seed=1)
        write_trace_file(d / f"{m}.json", t)
    return d


@pytest.mark.slow
def test_json_has_the_contracted_shape(
    traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "a1.json"
    code = main(
        ["sim", "--scenario", "a1", "--seeds", "2", "--traces", str(traces), "--json", str(out), "--quiet"]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["scenario"] == "A1"
    assert set(data["policies"]) == set(POLICIES)
    for figures in data["policies"].values():
        for key in ("avg_jct", "makespan", "jobs_improved", "best_reduction", "migrations", "ci95", "max"):
            assert key in figures
        assert isinstance(figures["ci95"], dict) and "avg_jct" in figures["ci95"]
        assert figures["avg_jct"] > 0 and figures["makespan"] > 0
        assert 0.0 <= figures["jobs_improved"] <= 1.0
    table = capsys.readouterr().out
    assert "| specon |" in table and "*paper: SpeCon*" in table and "-14.7 %" in table


def test_selected_policies_and_overrides(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    md = tmp_path / "a.md"
    args = ["sim", "--scenario", "A2", "--policy", "specon", "--seeds", "1", "--alpha", "0.05",
            "--interval", "20", "--weights", "3,2,1", "--traces", str(traces), "--json", str(out),
            "--markdown", str(md), "--quiet"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"ds", "specon"}
    assert (data["alpha"], data["interval"], data["weights"]) == (0.05, 20.0, [3.0, 2.0, 1.0])
    assert "sweep" not in data
    assert data["paper"]["avg_jct_reduction"] == 0.057  # Table III, alpha 0.05, 20 s
    assert md.read_text().startswith("### A2")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--weights", "1,2,3"], "progressing > watching > converged"),
        (["--weights", "1,2"], "three numbers"),
        (["--alpha", "-1"], "monitor.alpha"),
        (["--seeds", "0"], "seeds"),
        (["--interference", "0.5"], "interference"),
        (["--interference-exponent", "-1"], "interference_exponent must be >= 0"),
    ],
)
def test_bad_input_exits_2_with_a_reason(
    traces: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sim", "--scenario", "A1", "--seeds", "1", "--traces", str(traces), "--quiet", *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_no_traces_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--scenario", "A1", "--traces", str(tmp_path), "--quiet"]) == 2
    assert "no traces" in capsys.readouterr().err


@pytest.mark.slow
def test_plots_are_written(traces: Path, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    args = ["sim", "--scenario", "A1", "--seeds", "1", "--policy", "specon", "--traces", str(traces),
            "--plot", str(plots), "--quiet"]  # fmt: skip
    assert main(args) == 0
    for name in ("jct_cdf.png", "timelines.png"):
        assert (plots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_results_do_not_depend_on_the_process_hash_seed(traces: Path, tmp_path: Path) -> None:
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}.json"
        args = [sys.executable, "-m", "specon.cli.main", "sim", "--scenario", "A3", "--seeds", "1",
                "--traces", str(traces), "--json", str(out), "--quiet"]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(args, check=True, env=env, capture_output=True)
        data = json.loads(out.read_text())
        data.pop("cpu_seconds")
        outputs.append(data)
    assert outputs[0] == outputs[1]


def _sim_json(traces: Path, out: Path, *extra: str) -> dict[str, Any]:
    args = ["sim", "--scenario", "A1", "--seeds", "1", "--traces", str(traces), "--json", str(out), "--quiet"]
    assert main([*args, *extra]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_a_policy_file_replaces_the_specon_defaults(traces: Path, tmp_path: Path) -> None:
    # A policy that moves whenever the scores say so, and one that never sees convergence and
    # never rebalances: the first moves, the second must not move anything.
    moving = tmp_path / "moving.yaml"
    moving.write_text("apiVersion: specon/v1alpha1\nkind: Policy\npriority: {rule: none}\n"
                      "monitor: {classifier: specon}\n"
                      "placement:\n  require_gain: false\n"
                      "migration:\n  min_residence: 0\n")  # fmt: skip
    still = tmp_path / "still.yaml"
    still.write_text("apiVersion: specon/v1alpha1\nkind: Policy\nmonitor:\n  classifier: specon\n"
                     "  alpha: 1.0e-9\n"
                     "  interval: 20\nrebalance:\n  mode: 'off'\n")  # fmt: skip
    default = _sim_json(traces, tmp_path / "default.json", "--policy", str(moving))
    assert default["policies"]["specon"]["migrations"] > 0
    data = _sim_json(traces, tmp_path / "file.json", "--policy", str(still))
    assert set(data["policies"]) == {"ds", "specon"}
    assert data["policies"]["specon"]["migrations"] == 0
    assert (data["alpha"], data["interval"], data["policy_file"]) == (1e-9, 20.0, str(still))
    # The options still override the file.
    over = _sim_json(traces, tmp_path / "over.json", "--policy", str(still), "--alpha", "0.05",
                     "--policy", "balancer")  # fmt: skip
    assert set(over["policies"]) == {"ds", "specon", "balancer"}
    assert (over["alpha"], over["interval"]) == (0.05, 20.0)


@pytest.mark.parametrize(
    ("policy_files", "message"),
    [
        (["a.yaml", "b.yaml"], "at most one policy file"),
        (["nope"], "neither a policy"),
        (["bad.yaml"], "monitor.alpha"),
    ],
)
def test_bad_policy_files_exit_2_with_a_reason(
    traces: Path, tmp_path: Path, policy_files: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text("apiVersion: specon/v1alpha1\nkind: Policy\n")
    (tmp_path / "bad.yaml").write_text("apiVersion: specon/v1alpha1\nkind: Policy\nmonitor:\n  alpha: -1\n")
    args = ["sim", "--scenario", "A1", "--seeds", "1", "--traces", str(traces), "--quiet"]
    for name in policy_files:
        args += ["--policy", str(tmp_path / name)]
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_params_file_then_options(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"interference": 1.2, "migration_downtime": 9}))
    data = _sim_json(traces, tmp_path / "p.json", "--params", str(params))
    assert (data["params"]["interference"], data["params"]["migration_downtime"]) == (1.2, 9.0)
    data = _sim_json(traces, tmp_path / "q.json", "--params", str(params), "--interference", "1.3")
    assert (data["params"]["interference"], data["params"]["migration_downtime"]) == (1.3, 9.0)
    data = _sim_json(
        traces, tmp_path / "r.json", "--migration-downtime", "2.5", "--interference-exponent", "0"
    )
    assert (data["params"]["migration_downtime"], data["params"]["interference_exponent"]) == (2.5, 0.0)
    slower = _sim_json(traces, tmp_path / "s.json", "--interference-exponent", "0.5", "--policy", "ds")
    assert slower["policies"]["ds"]["avg_jct"] > data["policies"]["ds"]["avg_jct"]
    params.write_text(json.dumps({"speed": 2}))
    args = [
        "sim",
        "--scenario",
        "A1",
        "--seeds",
        "1",
        "--traces",
        str(traces),
        "--quiet",
        "--params",
        str(params),
    ]
    assert main(args) == 2
    assert "speed: unknown key" in capsys.readouterr().err
