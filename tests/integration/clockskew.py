"""Hosts whose wall clocks disagree: a daemon run under libfaketime (Debian ``faketime``).

``SkewedHost(host, seconds)`` is an ``EmbeddedCluster`` host (``address`` + ``wrap``) whose
commands see the wall clock ``seconds`` off: ``CLOCK_REALTIME`` (``time.time()``,
``gettimeofday``, OpenSSL's certificate dates) and the file times ``stat`` reports are shifted,
as on a machine whose clock is wrong. ``CLOCK_MONOTONIC`` is left alone
(``FAKETIME_DONT_FAKE_MONOTONIC=1``): a wrong wall clock does not make a machine's monotonic
clock run differently, and asyncio's timers and Python's lock timeouts read it (libfaketime
0.9.10 fakes it as an epoch time, and a lock's ``sem_clockwait``, which it does not intercept,
then waits for ever). Whatever the daemon starts (its jobs) inherits the skew, as processes
on one host share its clock.

libfaketime 0.9.10 (Debian 12) mishandles ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``
with the monotonic clock left alone: it passes the kernel a negative time, so Python 3.11's
``time.sleep`` fails with EINVAL (libfaketime issue #426). A shim preloaded before it sends
every non-``CLOCK_REALTIME`` sleep straight to the kernel; it is compiled once per user into
the cache (``$SPECON_CACHE``, else ``~/.cache/specon``).

The daemon is started by ``env``, which execs it: its pid, and the signals sent to it, are the
daemon's own (the ``faketime`` command forks, so it is not used).
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from specon.embedded.cluster import Host, TlsFiles

APT = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "--no-install-recommends"]
# The multi-threaded variant: agents read logs and take locks in worker threads.
LIBRARY_GLOB = "/usr/lib/*/faketime/libfaketimeMT.so.1"

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Sleeps on a clock other than the wall clock go to the kernel as asked; the wall clock's go
   to libfaketime, which turns a faked deadline into a real one. */
int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (id != CLOCK_REALTIME) {
        long r = syscall(SYS_clock_nanosleep, id, flags, req, rem);
        return r == -1 ? errno : 0;
    }
    if (next == NULL)
        next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))dlsym(
            RTLD_NEXT, "clock_nanosleep");
    return next(id, flags, req, rem);
}
"""


class FaketimeUnavailableError(RuntimeError):
    """libfaketime cannot be installed or prepared here (not root, no apt-get, no compiler)."""


def _library() -> str | None:
    found = sorted(glob.glob(LIBRARY_GLOB))
    return found[0] if found else None


def _cache() -> Path:
    base = os.environ.get("SPECON_CACHE") or str(Path.home() / ".cache" / "specon")
    return Path(base) / "faketime"


def _apt_install(*packages: str) -> None:
    if os.geteuid() != 0:
        raise FaketimeUnavailableError(f"{', '.join(packages)} missing, and installing needs root")
    if shutil.which("apt-get") is None:
        raise FaketimeUnavailableError(f"{', '.join(packages)} missing, and there is no apt-get here")
    done = subprocess.run([*APT, *packages], capture_output=True, text=True, check=False)
    if done.returncode != 0:  # a stale package list: refresh it once, then try again
        subprocess.run([*APT[:3], "update"], capture_output=True, check=False)
        done = subprocess.run([*APT, *packages], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FaketimeUnavailableError(f"apt-get install {' '.join(packages)}: {done.stderr.strip()[-500:]}")


def prepare() -> list[str]:
    """The ``LD_PRELOAD`` entries that skew a process's clock (the shim, then libfaketime),
    installing ``faketime`` (and a C compiler for the shim) with apt where missing.
    ``FaketimeUnavailableError`` saying why where that cannot be done."""
    if _library() is None:
        _apt_install("faketime")
    library = _library()
    if library is None:
        raise FaketimeUnavailableError(f"libfaketime installed, but no {LIBRARY_GLOB}")
    shim = _cache() / f"monotonic-sleep-{hashlib.sha256(SHIM_C.encode()).hexdigest()[:12]}.so"
    if not shim.exists():
        if shutil.which("cc") is None:
            _apt_install("gcc", "libc6-dev")
        shim.parent.mkdir(parents=True, exist_ok=True)
        source = shim.with_suffix(f".{os.getpid()}.c")
        built = shim.with_suffix(f".{os.getpid()}.tmp")
        source.write_text(SHIM_C)
        try:
            done = subprocess.run(
                ["cc", "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise FaketimeUnavailableError(f"cannot build the sleep shim: {done.stderr.strip()}")
            os.replace(built, shim)  # concurrent sessions: each renames a whole file
        finally:
            source.unlink(missing_ok=True)
            built.unlink(missing_ok=True)
    return [str(shim), library]


def skew_env(seconds: float, preload: Sequence[str]) -> dict[str, str]:
    """The environment that puts a process's wall clock ``seconds`` off (monotonic untouched)."""
    return {
        "LD_PRELOAD": ":".join(preload),
        "FAKETIME": f"{seconds:+.0f}s",  # an offset: the clock runs at its normal rate
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@dataclass(frozen=True)
class SkewedHost:
    """``host``, but everything it runs sees a wall clock ``seconds`` off (``prepare()``'s
    ``preload``)."""

    host: Host
    seconds: float
    preload: tuple[str, ...]

    @property
    def address(self) -> str:
        return self.host.address

    def wrap(self, argv: Sequence[str]) -> list[str]:
        env = [f"{k}={v}" for k, v in skew_env(self.seconds, self.preload).items()]
        return self.host.wrap(["env", *env, *argv])


def tls_issued_earlier(root: Path, address: str, seconds: float, preload: Sequence[str] | None) -> TlsFiles:
    """A test CA and the manager's certificate for ``address`` (``specon.testing.certs``), made by
    a process whose clock is ``seconds`` behind (with ``preload``; without, now): as a CA would
    have issued them that long ago, so that they are valid on the clock of an agent up to that
    far behind (the test CA backdates by five minutes only)."""
    code = (
        "import sys; from pathlib import Path; from specon.testing.certs import TestCA\n"
        "root = Path(sys.argv[1]); ca = TestCA.create(root / 'ca')\n"
        "print(ca.cert_path, *ca.issue(root / 'manager-tls', names=[sys.argv[2]]), sep='\\n')\n"
    )
    skew = skew_env(-seconds, preload) if preload else {}
    done = subprocess.run(
        [sys.executable, "-c", code, str(root), address],
        env={**os.environ, **skew},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"cannot make the test CA: {done.stderr.strip()[-1000:]}")
    ca, cert, key = (Path(line) for line in done.stdout.split())
    return TlsFiles(ca=ca, cert=cert, key=key)
