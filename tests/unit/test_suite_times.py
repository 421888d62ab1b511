"""tests/suite_times: the tables it makes of a JUnit report, with and without CPU figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.suite_times import cpu_seconds_used, main

CASE = (
    '<testcase classname="tests.{folder}.test_x" name="{name}" time="{secs}">'
    '<properties><property name="infra" value="{infra}"/>{cpu}</properties>{outcome}</testcase>'
)


def report(tmp_path: Path, *, cpu: bool) -> Path:
    rows = [
        ("unit", "test_a", 2.0, "unit", 1.5, ""),
        ("k8s", "test_b", 6.0, "kube-apiserver", 4.5, "<failure/>"),
    ]
    cases = "".join(
        CASE.format(
            folder=folder,
            name=name,
            secs=secs,
            infra=infra,
            cpu=f'<property name="cpu_seconds" value="{c}"/>' if cpu else "",
            outcome=outcome,
        )
        for folder, name, secs, infra, c, outcome in rows
    )
    path = tmp_path / "suite.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def test_the_tables_sum_time_and_cpu_by_folder_and_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(report(tmp_path, cpu=True)), "--markdown", "--by-cpu", "--slowest", "1"]) == 0
    out = capsys.readouterr().out
    assert "| tests/k8s | 1 | 6 | 75% | 4 | 75% | test_b (6) |" in out  # 4.5 CPU s of 6
    assert "| kube-apiserver | 1 | 6 | 75% | 4 | 75% | test_b (6) |" in out
    assert "2 tests, 8 s of test time, 6 CPU s, 1 failed" in out
    assert "The 1 most CPU (test s, CPU s):\n      6.0     4.5  tests/k8s/test_x.py::test_b" in out


def test_a_report_without_cpu_figures_has_no_cpu_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(report(tmp_path, cpu=False)), "--slowest", "1"]) == 0
    out = capsys.readouterr().out
    assert "CPU" not in out.split("The 1 slowest")[0]
    assert "| tests/unit | 1 | 2 | 25% | test_a (2) |" in out
    assert "      6.0       -  tests/k8s/test_x.py::test_b" in out


def test_cpu_seconds_used_counts_this_process() -> None:
    before = cpu_seconds_used()
    sum(i * i for i in range(300_000))
    assert cpu_seconds_used() > before
