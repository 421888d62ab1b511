"""The warm interpreter's pure parts: which commands it runs, its request format, and how a
warm launcher is found again by its run id."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from specon.runtime.local.cgroup_entry import Entry
from specon.runtime.local.launcher import find_launcher, warm_comm
from specon.runtime.local.warm import module_args
from specon.runtime.local.zygote import Request, listen_ready

PY = sys.executable


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ((PY, "-m", "specon.workloads", "--model", "vae"), ("--model", "vae")),
        ((PY, "-m", "specon.workloads"), ()),
        ((PY, "-m", "other.module", "--model", "vae"), None),
        ((PY, "train.py", "--model", "vae"), None),
        (("/usr/bin/env", "-m", "specon.workloads"), None),
        ((PY, "-c", "specon.workloads"), None),
        ((PY,), None),
    ],
)
def test_only_this_python_running_the_module_is_run_warm(
    command: tuple[str, ...], expected: tuple[str, ...] | None
) -> None:
    assert module_args(command, PY, "specon.workloads") == expected


def test_a_python_found_on_path_counts_when_it_is_the_same_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mypython").symlink_to(PY)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert module_args(("mypython", "-m", "m", "x"), PY, "m") == ("x",)
    assert module_args(("nosuchpython", "-m", "m"), PY, "m") is None


def request() -> Request:
    return Request(
        module="specon.workloads",
        args=("--model", "gru"),
        cwd="/v/jobs/a",
        env={"A": "1"},
        stdout="/v/jobs/a/stdout.log",
        stderr="/v/jobs/a/stderr.log",
        exits="/v/jobs/a/exits.jsonl",
        run_id="0123456789abcdef",
        worker="w0",
        entry=Entry(
            files=(("/cg/job/cgroup.procs", "/cg/cgroup.procs"), ("/cs/cgroup.procs", None)), affinity=(1,)
        ),
    )


def test_a_request_reads_back_as_written() -> None:
    req = request()
    assert Request.decode(req.encode()) == req
    bare = Request(**{**{f: getattr(req, f) for f in req.__dataclass_fields__}, "entry": Entry()})
    assert Request.decode(bare.encode()) == bare


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[]", b'{"module": "m"}', b'{"module": "m", "args": 1, "entry": {"files": 3}}'],
)
def test_a_bad_request_is_a_value_error_that_says_so(raw: bytes) -> None:
    with pytest.raises(ValueError, match="bad request"):
        Request.decode(raw)


def test_a_warm_launcher_is_found_by_its_name_and_a_cold_one_by_its_argv(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    run_warm, run_cold = "a" * 32, "b" * 32
    for pid, argv, comm in (
        ("10", b"python\0-m\0specon.runtime.zygote\0sock\0", warm_comm(run_warm)),
        ("11", b"python\0-I\0-S\0/x/launcher.py\0log\0" + run_cold.encode() + b"\0w0\0--\0", "python"),
        ("12", b"python\0job.py\0", "python"),
    ):
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(argv)
        (proc / pid / "comm").write_text(comm + "\n")
    assert len(warm_comm(run_warm)) <= 15  # the kernel keeps 15 bytes of a name
    assert find_launcher(run_warm, proc) == 10
    assert find_launcher(run_cold, proc) == 11
    assert find_launcher("c" * 32, proc) is None


def test_the_server_socket_appears_only_once_it_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``WarmInterpreter.ready`` (and the GPU standby's runtime) take an existing socket for a
    # server that accepts: bound in place, it refused connections until ``listen``.
    path = tmp_path / "zygote.sock"
    seen: list[bool] = []
    listen = socket.socket.listen

    def watched(self: socket.socket, *args: int) -> None:
        seen.append(path.exists())
        listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", watched)
    srv = listen_ready(str(path), backlog=4, timeout=1.0)
    with srv, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        assert seen == [False] and path.exists() and not path.with_name("zygote.sock.tmp").exists()
        assert path.stat().st_mode & 0o777 == 0o600
        c.connect(str(path))
