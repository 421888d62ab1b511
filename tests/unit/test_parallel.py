"""The suite's own parallel plumbing (tests/parallel.py): which tests share a worker, and the
lock that runs a ``serial`` test alone."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.parallel import MODULE_GROUP_RANK, group_of, start_rank, turn


def test_a_test_goes_with_the_heaviest_fixture_it_uses() -> None:
    assert group_of({"real_namespace", "kube_binaries", "tmp_path"}, False, "m.py") == "real_nodes"
    assert group_of({"kube_namespace", "fake_kubelet"}, True, "m.py") == "kube"
    assert group_of({"docker_engine"}, False, "m.py") == "docker_engines"


def test_module_fixtures_keep_their_module_on_one_worker_and_the_rest_go_anywhere() -> None:
    assert group_of({"chromium", "tmp_path"}, True, "tests/integration/test_browser.py") == (
        "module:tests/integration/test_browser.py"
    )
    assert group_of({"tmp_path"}, False, "m.py") is None


def test_serial_tests_form_one_group_unless_a_heavy_fixture_holds_them() -> None:
    assert group_of({"tmp_path"}, True, "m.py", serial=True) == "serial"
    assert group_of({"kube_namespace"}, False, "m.py", serial=True) == "kube"


def test_heavy_groups_start_first_then_module_groups_then_the_rest_and_serial_tests_last() -> None:
    ranks = [start_rank(g) for g in ("real_nodes", "kube", "docker_engines", "module:x.py", None, "serial")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert start_rank("module:x.py") == MODULE_GROUP_RANK


def _holder(
    lock_dir: Path, alone: bool, entered: threading.Event, leave: threading.Event
) -> threading.Thread:
    def run() -> None:
        with turn(lock_dir, alone=alone):
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_shared_turns_overlap_and_a_serial_one_waits_until_none_is_held(tmp_path: Path) -> None:
    leave_a, leave_s, leave_b = threading.Event(), threading.Event(), threading.Event()
    in_a, in_s, in_b = threading.Event(), threading.Event(), threading.Event()
    a = _holder(tmp_path, False, in_a, leave_a)
    assert in_a.wait(5)
    serial = _holder(tmp_path, True, in_s, leave_s)
    assert not in_s.wait(0.3)  # a shared turn is held
    # A shared turn asked for meanwhile is not held up by the waiting serial one.
    b = _holder(tmp_path, False, in_b, leave_b)
    assert in_b.wait(5)
    leave_a.set()
    assert not in_s.wait(0.3)  # b still holds its turn
    leave_b.set()
    assert in_s.wait(5)  # alone now
    in_c, leave_c = threading.Event(), threading.Event()
    c = _holder(tmp_path, False, in_c, leave_c)
    assert not in_c.wait(0.3)  # and nothing starts beside it
    leave_s.set()
    assert in_c.wait(5)
    leave_c.set()
    for t in (a, serial, b, c):
        t.join(5)


def test_no_test_module_star_imports_a_conftest() -> None:
    """An imported fixture is registered again as the importing module's: each such module
    then starts session fixtures of its own (one kube-apiserver per module, kept to the end).
    Plain helpers may be imported by name."""
    tests = Path(__file__).resolve().parents[1]
    offenders = [
        str(path.relative_to(tests))
        for path in tests.rglob("*.py")
        if re.search(r"^from tests\.[\w.]*conftest import \*", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []


@pytest.mark.slow
def test_under_xdist_a_group_runs_on_one_worker() -> None:
    """The groups reach pytest-xdist's scheduler: the tests of a module-fixture file on one
    worker, their ids carrying the group (with a pytest xdist cannot mark, it loses them
    silently: pytest-xdist#1386)."""
    root = Path(__file__).resolve().parents[2]
    target = "tests/unit/daemon/test_tls.py"
    argv = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"]
    done = subprocess.run([*argv, target], cwd=root, capture_output=True, text=True, check=False, timeout=240)
    line = re.compile(r"^\[(gw\d+)\] \[[ \d]+%\] (?:PASSED|FAILED|SKIPPED|ERROR) (.+?)\s*$", re.MULTILINE)
    ran = line.findall(done.stdout)
    grouped = {worker for worker, nodeid in ran if nodeid.endswith(f"@module:{target}")}
    # All but the one test that does not use the file's module-scoped CA carry the group.
    assert len([n for _, n in ran if n.endswith(f"@module:{target}")]) >= 10, done.stdout[-2000:]
    assert len(grouped) == 1, "the group was split between workers"


@pytest.mark.slow
def test_a_quiet_run_under_xdist_ends_with_its_random_order_seed() -> None:
    """``make test`` runs with -q, which hides pytest-randomly's header: the seed that repeats
    the order is said at the end instead."""
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "--randomly-seed=4242"]
    target = "tests/unit/coordinator/test_deadlines.py"
    done = subprocess.run([*argv, target], cwd=root, capture_output=True, text=True, check=False, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "random order: repeat it with -p randomly --randomly-seed=4242" in done.stdout, done.stdout[-2000:]
