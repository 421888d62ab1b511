"""``specon status``: the tables, and its errors against a real HTTP server on loopback."""

from __future__ import annotations

import http.server
import io
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from specon.cli import cmd_status
from specon.cli.main import build_parser
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import ErrorReply
from specon.wire.status import ContainerStatus, Status, WorkerStatus

NOW = 1_700_000_000.0
READ_TOKEN = "r" * 32


def _status() -> Status:
    return Status(
        now=NOW,
        mode="default",
        policy_generation=2,
        workers=(
            WorkerStatus(
                id=WorkerId("w0"),
                address="127.0.0.1:7701",
                ready=True,
                reachable=True,
                heartbeat_age=1.2,
                capacity=Resources(cpu=4.0),
                usage=0.634,
                containers=(ContainerId("job-1"),),
            ),
            WorkerStatus(
                id=WorkerId("w1"),
                address="127.0.0.1:7702",
                ready=False,
                reachable=False,
                heartbeat_age=3725.0,
                capacity=Resources(cpu=2.0),
                usage=0.0,
            ),
        ),
        containers=(
            ContainerStatus(
                id=ContainerId("job-1"),
                worker=WorkerId("w0"),
                category=Category.CONVERGED,
                step=750,
                total_steps=1000,
                eta=130.0,
                migrations=1,
                rebalances=2,
                pending_request=True,
            ),
            ContainerStatus(
                id=ContainerId("job-2"), worker=WorkerId("w1"), category=Category.PROGRESSING, step=5
            ),
            ContainerStatus(
                id=ContainerId("job-3"),
                worker=WorkerId("w1"),
                category=Category.CONVERGED,
                phase="finished",
                step=400,
                total_steps=400,
                eta=0.0,
            ),
        ),
        next="c:job-3",
        total_workers=2,
        total_containers=40,
        total_migrations=1,
    )


def test_the_tables_read_like_kubectl_get() -> None:
    text = cmd_status.render(_status(), now=lambda: NOW)
    lines = text.splitlines()
    assert lines[0].startswith("manager mode default · policy generation 2 · 2 workers · 40 jobs")
    workers = lines[lines.index(next(x for x in lines if x.startswith("WORKER"))) :][:3]
    assert workers[0].split() == ["WORKER", "AGENT", "REACHABLE", "HEARTBEAT", "CPUS", "LOAD", "JOBS"]
    assert workers[1].split() == ["w0", "127.0.0.1:7701", "yes", "1s", "4", "63%", "1"]
    assert workers[2].split() == ["w1", "127.0.0.1:7702", "NO", "(gone)", "1h2m", "2", "0%", "0"]
    head = next(i for i, x in enumerate(lines) if x.startswith("JOB "))
    assert lines[head].split() == [
        "JOB", "CATEGORY", "PHASE", "STEP/TOTAL", "PROGRESS", "ETA", "WORKER", "MIGRATIONS", "REBALANCES",
    ]  # fmt: skip
    assert lines[head + 1].split() == [
        "job-1", "converged", "(asks", "to", "move)", "running", "750/1000", "75%", "2m10s", "w0", "1", "2",
    ]  # fmt: skip
    assert lines[head + 2].split() == ["job-2", "progressing", "running", "5/-", "-", "-", "w1", "0", "0"]
    assert lines[head + 3].split() == [
        "job-3",
        "converged",
        "finished",
        "400/400",
        "100%",
        "done",
        "w1",
        "0",
        "0",
    ]
    # Columns line up: every row's second column starts where its header's does.
    col = lines[head].index("CATEGORY")
    assert all(lines[head + i][col - 3 : col] == "   " for i in (1, 2, 3))
    assert lines[-1] == "more: specon status --after c:job-3"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (59.6, "1m"), (130, "2m10s"), (7260, "2h1m"), (90000, "1d1h")],
)
def test_ages_are_kubectl_s(seconds: float | None, text: str) -> None:
    assert cmd_status.age(seconds) == text


# --- against a server ----------------------------------------------------------------------------


class _Manager(http.server.BaseHTTPRequestHandler):
    """Answers GET /v1/status as the manager does: 401 without the read token, 403 for another."""

    def do_GET(self) -> None:
        auth = self.headers.get(protocol.AUTH_HEADER)
        type(self).seen.append(self.path)
        if auth == f"Bearer {READ_TOKEN}":
            code, body = 200, protocol.encode(_status())
        elif auth == "Bearer agent-token-0123456789abcdef0123":
            code, body = (
                403,
                protocol.encode(ErrorReply("agent:w0 may not read the status: use the read token")),
            )
        else:
            code, body = 401, protocol.encode(ErrorReply("missing or wrong bearer token"))
        self.send_response(code)
        self.send_header("Content-Type", protocol.CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass

    seen: list[str] = []


@pytest.fixture
def manager() -> Iterator[str]:
    _Manager.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Manager)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(*argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["status", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = cmd_status.main(args, out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def read_token(tmp_path: Path) -> Path:
    path = tmp_path / "read"
    path.write_text(READ_TOKEN + "\n")
    return path


def test_the_read_token_from_a_file_reads_a_page_and_json_is_the_answer_as_it_came(
    manager: str, read_token: Path
) -> None:
    code, out, err = run(
        "--manager", manager, "--token-file", str(read_token), "--limit", "5", "--after", "w:a"
    )
    assert (code, err) == (0, "") and "job-1" in out and "75%" in out
    assert _Manager.seen == ["/v1/status?limit=5&after=w%3Aa"]
    code, out, _ = run("--manager", manager, "--token-file", str(read_token), "--json")
    assert code == 0 and protocol.decode(out, Status) == _status() and out.count("\n") == 1


def test_the_token_may_come_from_the_environment(manager: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECON_TOKEN", READ_TOKEN)
    assert run("--manager", manager)[0] == 0


def test_401_says_which_token_to_give_and_403_to_use_the_read_token(
    manager: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECON_TOKEN", raising=False)
    code, out, err = run("--manager", manager)
    assert code == 1 and out == ""
    assert "needs a token it accepts (401: missing or wrong bearer token)" in err
    assert "--read-token-file" in err and "--token-file FILE or $SPECON_TOKEN" in err
    agent = tmp_path / "agent"
    agent.write_text("agent-token-0123456789abcdef0123")
    code, _, err = run("--manager", manager, "--token-file", str(agent))
    assert code == 1 and "refused this token (403: agent:w0 may not read the status" in err
    assert "use its read token" in err and "agent-token" not in err  # never a token in a message


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # closed below: nothing listens there
    return port


def test_an_unreachable_manager_is_said_plainly() -> None:
    port = _closed_port()
    code, _, err = run("--manager", f"http://127.0.0.1:{port}")
    assert code == 1 and f"cannot reach the manager at http://127.0.0.1:{port}" in err
    assert "is specon-manager running there?" in err


def test_a_token_is_not_sent_in_clear_text_off_loopback_nor_read_from_a_missing_file(tmp_path: Path) -> None:
    code, _, err = run("--manager", "http://manager.example:7700")
    assert code == 2 and "refusing to send the bearer token in clear text" in err
    code, _, err = run("--token-file", str(tmp_path / "missing"))
    assert code == 2 and "--token-file: cannot read" in err
    code, _, err = run("--manager", "https://127.0.0.1:1", "--ca-file", str(tmp_path / "missing.pem"))
    assert code == 2 and "--ca-file: cannot use" in err


def test_a_bad_limit_or_watch_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--limit", "0"], ["--limit", "x"], ["--watch", "0"], ["--watch", "nan"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["status", *argv])
        assert exit_.value.code == 2
    assert "expected" in capsys.readouterr().err


def test_watch_shows_it_again_and_says_when_the_manager_is_gone(
    manager: str, read_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt  # what Ctrl-C does

    monkeypatch.setattr(cmd_status.time, "sleep", sleep)
    args = build_parser().parse_args(
        ["status", "--manager", manager, "--token-file", str(read_token), "--watch", "0.5"]
    )
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        cmd_status.main(args, out, io.StringIO())
    assert sleeps == [0.5, 0.5] and out.getvalue().count(cmd_status.CLEAR) == 2
    assert out.getvalue().count("job-1") == 2
    # A manager that is gone is said on the screen, and the watch goes on.
    sleeps.clear()
    args.manager = f"http://127.0.0.1:{_closed_port()}"
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        cmd_status.main(args, out, io.StringIO())
    assert len(sleeps) == 2 and out.getvalue().count("specon status: cannot reach the manager") == 2


def test_json_watch_keeps_stdout_json_lines(
    manager: str, read_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cmd_status.time, "sleep", lambda _s: (_ for _ in ()).throw(KeyboardInterrupt))
    args = build_parser().parse_args(
        ["status", "--manager", manager, "--token-file", str(read_token), "--watch", "--json"]
    )
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        cmd_status.main(args, out, io.StringIO())
    assert [json.loads(line)["kind"] for line in out.getvalue().splitlines()] == ["Status"]
