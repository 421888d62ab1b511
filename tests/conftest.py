"""Markers that follow from where a test lives, so none is left off by hand; the groups and the
lock that let pytest-xdist workers share one machine (tests/parallel.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.parallel import group_of, start_rank, turn
from tests.suite_times import CPU_PROPERTY, INFRA_OUT_ENV, cpu_seconds_used, infra_of

HERE = Path(__file__).resolve().parent
CPU_AT_START = pytest.StashKey[float]()
# Folder -> the markers of every test in it.
FOLDER_MARKERS = {
    "integration": ("integration",),
    "docker": ("integration", "docker"),
    "k8s": ("integration", "k8s"),
}
NARROW_SCOPES = ("module", "class", "package")


def _group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    # A fixture of a narrower scope than the session that is defined in this tree (not a
    # built-in): set up again on every worker that gets one of its tests.
    module_scoped = any(
        d.scope in NARROW_SCOPES and d.baseid != "" for defs in info.name2fixturedefs.values() for d in defs
    )
    serial = item.get_closest_marker("serial") is not None
    return group_of(info.names_closure, module_scoped, item.nodeid.split("::", 1)[0], serial=serial)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-randomly shuffles the tests (its seed is printed; -p no:randomly keeps file order)
    # and would also reseed `random` alike before every test on every worker: two workers'
    # tests would then draw the same "random" names at the same time. One stream per process.
    if hasattr(config.option, "randomly_reset_seed"):
        config.option.randomly_reset_seed = False


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    # pytest-randomly prints its seed in the header, which -q (make test) leaves out: the order
    # of a failed run must be repeatable, so the summary at the end says it, beside the failures.
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"random order: repeat it with -p randomly --randomly-seed={seed}")


# tryfirst: before xdist's worker turns the xdist_group markers into its groups (its hook is
# registered after this conftest, so it would otherwise run first and find none).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.resolve().relative_to(HERE).parts[0]
        except ValueError:
            continue
        for name in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(name)
    # After pytest-randomly's shuffle (a wrapper: before every plain hook). The sort is stable:
    # within a rank the shuffled order stays.
    groups = {item.nodeid: _group(item) for item in items}
    for item in items:
        if (group := groups[item.nodeid]) is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: start_rank(groups[item.nodeid]))
    # What each test starts, as a JUnit property (python -m tests.suite_times sums by it).
    kinds = {
        item.nodeid: infra_of(getattr(item, "fixturenames", ()), item.nodeid.split("::", 1)[0])
        for item in items
    }
    for item in items:
        item.user_properties.append(("infra", kinds[item.nodeid]))
    if out := os.environ.get(INFRA_OUT_ENV):
        Path(out).write_text(json.dumps(kinds))


# A wrapper outside pytest-timeout's (tryfirst): waiting for the turn is not the test's time, and
# the turn covers the test's setup and teardown too.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Under xdist, a test marked ``serial`` runs while no other worker runs one (parallel.turn)."""
    item.stash[CPU_AT_START] = cpu_seconds_used()
    if not hasattr(item.config, "workerinput"):
        return (yield)
    # Every worker's base temp is <run>/popen-gwN: the run's folder is theirs in common.
    runs = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]
    with turn(runs, alone=item.get_closest_marker("serial") is not None):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, object, object]:
    """The CPU the test used, setup to teardown, as a JUnit property (tests.suite_times): added
    before the teardown's report is made, which is the one JUnit takes properties from."""
    if call.when == "teardown" and CPU_AT_START in item.stash:
        item.user_properties.append((CPU_PROPERTY, f"{cpu_seconds_used() - item.stash[CPU_AT_START]:.2f}"))
    return (yield)


# The network hosts fixture (tests/hosts.py), for every folder.
from tests.hosts import net_hosts  # noqa: E402, F401
