"""How `make test` runs the suite on several pytest-xdist workers without two tests meeting.

Every per-test resource is private already (ports from the OS, ``mkdtemp`` folders, names that
carry the pid, network-namespace slots taken under a lock: docs/development.md). What remains:

- **Groups.** Tests that share a heavy fixture run on one worker (``--dist loadgroup``), so it
  starts once per run, not once per worker: the real-nodes cluster, the kube-apiservers, the two
  Docker engines, and each module whose fixtures are module-scoped (a browser, a training run).
  Grouped tests go first, heaviest first, so the longest chains start at once.
- **Serial tests.** A test marked ``serial`` measures CPU shares or timings that the other
  workers' load would disturb: it runs alone. They form one group, handed out last (make runs
  xdist with ``--no-loadscope-reorder``, so the workers take the tests in this order). Each
  test holds a shared lock for its run and a serial one an exclusive lock. A waiting serial
  test does not stop the other workers from starting tests: it runs once they have drained,
  near the end of the run. (Blocking them behind it, a turnstile did, left the machine idle
  while the longest test then running finished: about 3 minutes of half-used CPU per run.)
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterable, Iterator
from pathlib import Path

# A heavy fixture -> the group of every test that uses it; the first match wins, so a test using
# the real nodes (which need an apiserver too) goes with them. Listed heaviest first: the order
# in which the groups are started.
HEAVY_FIXTURES: tuple[tuple[str, frozenset[str]], ...] = (
    ("real_nodes", frozenset({"real_nodes", "real_namespace", "real_cluster", "node_binaries"})),
    ("kube", frozenset({"kube_cluster", "kube_rbac_cluster", "kube_api", "kube_namespace", "fake_kubelet"})),
    (
        "docker_engines",
        frozenset({"_engines", "docker_engines", "docker_engine", "python_images"}),
    ),
)
GROUP_ORDER = {name: rank for rank, (name, _) in enumerate(HEAVY_FIXTURES)}
MODULE_GROUP_RANK = len(HEAVY_FIXTURES)  # after the heavy groups, before ungrouped tests


SERIAL_GROUP = "serial"


def group_of(
    fixtures: Iterable[str], module_scoped: bool, module: str, *, serial: bool = False
) -> str | None:
    """The xdist group of a test using ``fixtures`` (``module_scoped``: one of them is scoped to
    its module ``module``; ``serial``: it is marked so), or None: any worker may run it."""
    used = set(fixtures)
    for name, members in HEAVY_FIXTURES:
        if used & members:
            return name
    if serial:
        return SERIAL_GROUP
    return f"module:{module}" if module_scoped else None


def start_rank(group: str | None) -> int:
    """Where a test of ``group`` goes in the order the workers are handed tests: the serial
    tests last, when the other workers are running out of work anyway and waiting for them to
    finish costs least."""
    if group == SERIAL_GROUP:
        return MODULE_GROUP_RANK + 2
    if group is None:
        return MODULE_GROUP_RANK + 1
    return GROUP_ORDER.get(group, MODULE_GROUP_RANK)


@contextlib.contextmanager
def turn(lock_dir: Path, *, alone: bool) -> Iterator[None]:
    """Hold this worker's turn to run a test: shared with the other workers' tests, or ``alone``
    (exclusive: granted when no other test runs; shared turns asked meanwhile go first)."""
    with (lock_dir / "tests.lock").open("a") as tests:
        fcntl.flock(tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(tests, fcntl.LOCK_UN)
