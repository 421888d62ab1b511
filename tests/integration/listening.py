"""Servers started on loopback ports picked for them, without losing the race for the port.

A port found free (bind to port 0, close) is free only at that moment: until the server binds
it, any other process may take it. Other test runs on this machine pick ports the same way,
and every outgoing connection takes an ephemeral port as ``bind(0)`` does. The server then cannot listen and
exits (a test failing by chance), or a stranger answers where the test expects its server.

:func:`serve_on_free_port` starts the server, waits until *that process* listens on the port
(``/proc``, not a probe any listener would answer), and starts it again on another port when
it exited saying the address was in use. :func:`listens` and :data:`IN_USE` serve servers
started otherwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from specon.embedded.cluster import free_port

#: How a server says its port was taken (EADDRINUSE, as Python and Go write it; match it lowercased).
IN_USE = "address already in use"
LOOPBACK = "127.0.0.1"
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


class PortTakenError(RuntimeError):
    """The server exited because another process held its port."""


def _listening_inodes(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(f"socket:[{fields[9]}]")
    return found


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a socket listening on TCP ``port``."""
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) in inodes:
                    return True
    return False


def _read_from(log: Path, offset: int) -> str:
    try:
        with log.open("rb") as f:
            if os.fstat(f.fileno()).st_size >= offset:  # else rewritten since: all of it is new
                f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return "(no log)"


def wait_listening(
    proc: subprocess.Popen[bytes], port: int, log: Path, *, offset: int = 0, timeout: float = 30.0
) -> None:
    """Return once ``proc`` listens on ``port``. Raise :class:`PortTakenError` when it exited and
    its log (from ``offset``) says the address was in use, ``RuntimeError`` when it exited
    otherwise, ``TimeoutError`` when it did neither in ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not listens(proc.pid, port):
        if proc.poll() is not None:
            text = _read_from(log, offset)
            if IN_USE in text.lower():
                raise PortTakenError(f"port {port} was taken before the server bound it:\n{text[-2000:]}")
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not listen on {port} in {timeout:.0f} s")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def serve_on_free_port(
    start: Callable[[int], subprocess.Popen[bytes]],
    log: Path,
    *,
    host: str = LOOPBACK,
    attempts: int = 5,
    timeout: float = 30.0,
) -> tuple[subprocess.Popen[bytes], int]:
    """``start(port)`` on a port free a moment ago, until the process it returns listens
    there; on another port when that one was taken meanwhile. ``log``: where the process
    writes its stderr (appended to or rewritten: only what a start adds is read)."""
    for attempt in range(1, attempts + 1):
        port = free_port(host)
        offset = log.stat().st_size if log.exists() else 0
        proc = start(port)
        try:
            wait_listening(proc, port, log, offset=offset, timeout=timeout)
        except PortTakenError:
            stop(proc)
            if attempt == attempts:
                raise
        except BaseException:
            stop(proc)
            raise
        else:
            return proc, port
    raise AssertionError("unreachable")
