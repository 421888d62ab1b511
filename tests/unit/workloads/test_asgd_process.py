"""``python -m specon.workloads.asgd``: real PS and worker processes on 127.0.0.1, and the CLI's
answers to bad input."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow]

CLI = [sys.executable, "-m", "specon.workloads.asgd"]
MODEL = ["--inputs", "32", "--hidden", "64", "--layers", "1"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_command_has_help() -> None:
    for cmd in ("ps", "worker", "profile"):
        out = subprocess.run([*CLI, cmd, "--help"], capture_output=True, text=True, check=False, timeout=30)
        assert out.returncode == 0 and "usage:" in out.stdout, out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker", "--ps", "nohost", "--id", "0", "--log", "/tmp/x"], "--ps must be HOST:PORT"),
        (
            ["worker", "--ps", "127.0.0.1:1", "--id", "0", "--log", "/tmp/x", "--hidden", "0"],
            "hidden must be",
        ),
        (["profile", "--ps-log", "/nonexistent/ps", "--worker-log", "/nonexistent/w"], "No such file"),
        (["ps", "--log", "/tmp/x", "--duration", "0"], "--duration and --lr must be positive"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_an_unknown_congestion_control_stops_the_ps_before_anyone_joins(tmp_path: Path) -> None:
    argv = [*CLI, "ps", "--port", str(_port()), "--log", str(tmp_path / "ps"), "--congestion", "no-such-cc"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 1 and "'no-such-cc' refused" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_an_unreachable_ps_is_a_clear_error_in_bounded_time(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = subprocess.run(
        [*CLI, "worker", "--ps", f"127.0.0.1:{_port()}", "--id", "0", "--log", str(tmp_path / "w"), *MODEL,
         "--connect-timeout", "1"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1 and "cannot reach the parameter server" in out.stderr
    assert time.monotonic() - t0 < 15


def test_two_workers_train_and_a_stray_client_is_turned_away(tmp_path: Path) -> None:
    port = _port()
    ps = subprocess.Popen(
        [*CLI, "ps", "--port", str(port), "--duration", "1.5", "--wait-workers", "2", "--log",
         str(tmp_path / "ps.jsonl"), *MODEL],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    workers = [
        subprocess.Popen(
            [
                *CLI,
                "worker",
                "--ps",
                f"127.0.0.1:{port}",
                "--id",
                str(i),
                "--batch",
                "16",
                "--log",
                str(tmp_path / f"w{i}.jsonl"),
                *MODEL,
            ],
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    # Something that does not speak the protocol: the PS closes on it, training goes on.
    for _ in range(100):
        try:
            stray = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            time.sleep(0.05)
    stray.sendall(b"GET / HTTP/1.1\r\nHost: ps\r\n\r\n" + b"\0" * 8)
    with contextlib.suppress(ConnectionResetError):  # closed with our bytes unread: a reset, as good
        assert stray.recv(1) == b""  # closed by the PS, at once
    stray.close()
    assert [w.wait(timeout=60) for w in workers] == [0, 0]
    assert ps.wait(timeout=60) == 1  # it reports the stray connection
    done = _records(tmp_path / "ps.jsonl")[-1]
    assert done["event"] == "done"
    assert set(done["by_worker"]) == {"0", "1"}
    assert any("bad magic" in e for e in done["errors"])
    assert done["moved"] > 0
    # Every gradient a worker pushed was applied once, but its last: that one got the BYE.
    pushed = sum(len(_records(tmp_path / f"w{i}.jsonl")) for i in range(2))
    assert done["updates"] == pushed - 2
    # Its CPU use is reported: some, never more than its wall time on this machine's cores.
    assert 0 < done["cpu_s"] <= done["wall_s"] * (os.cpu_count() or 1)


def test_a_one_worker_run_profiles_into_four_service_times(tmp_path: Path) -> None:
    port = _port()
    ps = subprocess.Popen([*CLI, "ps", "--port", str(port), "--duration", "1.0", "--log",
                           str(tmp_path / "ps.jsonl"), *MODEL])  # fmt: skip
    w = subprocess.run([*CLI, "worker", "--ps", f"127.0.0.1:{port}", "--id", "0", "--batch", "64", "--log",
                        str(tmp_path / "w.jsonl"), *MODEL], check=False, timeout=60)  # fmt: skip
    assert w.returncode == 0 and ps.wait(timeout=60) == 0
    out = subprocess.run(
        [*CLI, "profile", "--ps-log", str(tmp_path / "ps.jsonl"), "--worker-log", str(tmp_path / "w.jsonl")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    times = doc["service_times"]
    assert all(times[s] > 0 for s in ("worker", "uplink", "server", "downlink"))
    assert len(doc["predicted"]["hybrid"]) == 4
    assert doc["predicted"]["exact"][0] == pytest.approx(doc["predicted"]["hybrid"][0])
