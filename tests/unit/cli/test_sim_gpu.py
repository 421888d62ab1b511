"""``specon sim`` on a GPU scenario: DS (plain time-slicing), hermes and the default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specon.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "scenario-gpu.yaml"


@pytest.mark.slow
def test_the_gpu_example_compares_ds_hermes_and_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gpu.json"
    args = ["sim", "--scenario", str(EXAMPLE), "--seeds", "2", "--quiet", "--json", str(out)]
    assert (
        main([*args, "--policy", "ds", "--policy", "hermes", "--policy", "specon", "--policy", "bound"]) == 0
    )
    table = capsys.readouterr().out
    assert "eight GPU jobs" in table and "| hermes |" in table
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "gpu-demo" and doc["scenario_file"] == str(EXAMPLE)
    ds, hermes, specon, bound = (doc["policies"][p] for p in ("ds", "hermes", "specon", "bound"))
    # Freezing drops the 6 % time-slicing loss and runs the priority job alone.
    assert specon["avg_jct"] < ds["avg_jct"] and hermes["avg_jct"] < ds["avg_jct"]
    assert specon["makespan"] < ds["makespan"]
    assert bound["avg_jct"] <= min(ds["avg_jct"], hermes["avg_jct"], specon["avg_jct"])


def test_a_bad_gpu_scenario_exits_2_with_its_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: specon/v1alpha1\nkind: Scenario\nname: bad\n"
        "workers: [{name: g1, gpus: 1}]\n"
        "jobs: [{submit: 0, model: vae, steps: 10, gpu: 1}]\n",
        encoding="utf-8",
    )
    assert main(["sim", "--scenario", str(bad), "--seeds", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "workers[0].gpu_memory: missing" in err
    assert "jobs[0].gpu_step: missing" in err
