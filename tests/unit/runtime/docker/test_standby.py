"""Standby containers, the pure parts: which job may use which standby, the hand-over request,
the job's environment, the standby's create arguments; and the in-container server's
hand-over against a real process (a detached clone of a directory where this user may make
one, a plain directory descriptor otherwise), with no Docker engine and no GPU."""

from __future__ import annotations

import array
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specon.runtime.docker.engine import container_info, job_of, standby_kwargs
from specon.runtime.docker.recipe import LABEL_MIGRATION, Bind, HostRules, Recipe, gpu_request
from specon.runtime.docker.standby import (
    LABEL_STANDBY,
    SOCKET_DIR_INSIDE,
    HandOver,
    StandbyConfig,
    config_problems,
    idle_standby,
    job_env,
    refusal,
    server_command,
    standby_name,
)
from specon.runtime.docker.standby_pool import cpu_limits, detached_clone
from specon.runtime.docker.standby_server import HandOverError, take
from specon.runtime.volume import JobPaths

PY = "/opt/py/bin/python3"
BINDS = (Bind("/datasets", "/datasets"),)
CONFIG = StandbyConfig(images=("train:1",), gpus=(0, 1), python=PY, binds=BINDS)


def recipe(**over: Any) -> Recipe:
    base = Recipe(
        image="train:1",
        command=(PY, "-m", "specon.workloads", "--model", "gru"),
        binds=BINDS,
        device_requests=(gpu_request(1),),
        nano_cpus=int(2e9),
    )
    return replace(base, **over)


def test_a_one_gpu_job_of_the_image_and_module_may_use_a_standby() -> None:
    assert refusal(recipe(), CONFIG, migration_mode="checkpoint") is None
    cpu = replace(CONFIG, gpu_devices=False)  # a host with no GPU: CPU standbys for CPU jobs
    assert refusal(recipe(device_requests=()), cpu, migration_mode="checkpoint") is None
    assert refusal(recipe(), cpu, migration_mode="checkpoint") is not None


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"image": "other:1"}, "no standby for image"),
        ({"command": ("python3", "-m", "specon.workloads")}, "command"),  # another interpreter name
        ({"command": (PY, "-m", "evil")}, "command"),
        ({"command": (PY, "train.py")}, "command"),
        ({"device_requests": (gpu_request(2),)}, "GPUs"),
        ({"device_requests": ()}, "GPUs"),
        ({"network_mode": "host"}, "network"),
        ({"user": "1000"}, "user"),
        ({"init": True}, "init"),
        ({"mem_limit": 2**30}, "memory"),
        ({"binds": ()}, "binds"),
        ({"binds": (*BINDS, Bind("/models", "/models"))}, "binds"),
        ({"working_dir": "/srv"}, "working directory"),
        ({"labels": ((LABEL_MIGRATION, "criu"),)}, "CRIU"),
    ],
)
def test_any_other_job_starts_cold_with_the_reason(over: dict[str, Any], why: str) -> None:
    assert why in (refusal(recipe(**over), CONFIG, migration_mode="checkpoint") or "")


def test_a_host_moving_jobs_by_criu_uses_no_standby() -> None:
    assert "CRIU" in (refusal(recipe(), CONFIG, migration_mode="criu") or "")


def test_the_host_rules_judge_a_standby_config_as_a_recipe() -> None:
    rules = HostRules(volume="/srv/specon", ro_bind_prefixes=("/datasets",), images=("train:1",), gpus=1)
    assert config_problems(CONFIG, rules) == []
    problems = config_problems(replace(CONFIG, images=("other:1",)), rules)
    assert any("not among this host's allowed images" in p for p in problems)
    assert any(
        "read-only bind prefix" in p for p in config_problems(CONFIG, replace(rules, ro_bind_prefixes=()))
    )
    assert any("allows no GPU" in p for p in config_problems(CONFIG, replace(rules, gpus=0)))
    assert config_problems(replace(CONFIG, gpu_devices=False), replace(rules, gpus=0)) == []
    assert any("distinct" in p for p in config_problems(replace(CONFIG, gpus=(0, 0)), rules))


def test_the_job_contract_paths_are_relative_to_the_job_directory() -> None:
    env = job_env(recipe(env=(("A", "1"), ("OMP_NUM_THREADS", "4"))), "job-1", "host-1")
    assert env["SPECON_PROGRESS_FILE"] == "progress.jsonl"
    assert env["SPECON_CHECKPOINT_DIR"] == "checkpoints" and env["SPECON_DONE_FILE"] == "done"
    assert env["SPECON_JOB_ID"] == "job-1" and env["SPECON_WORKER"] == "host-1"
    assert env["A"] == "1" and env["OMP_NUM_THREADS"] == "4"  # the recipe's own win as cold
    assert job_env(recipe(), "j", "w")["OMP_NUM_THREADS"] == "1"


def test_the_request_round_trips_and_bad_ones_are_refused() -> None:
    req = HandOver("specon.workloads", ("--model", "gru"), {"A": "1"}, "r" * 32, "host-1")
    assert HandOver.decode(req.encode()) == req
    for bad in (
        b"not json\n",
        b'{"module": "m"}\n',
        b'{"module":"m","args":"x","env":{},"run_id":"r","worker":"w"}\n',
    ):
        with pytest.raises(ValueError, match="bad request"):
            HandOver.decode(bad)
    with pytest.raises(ValueError, match="bad request"):
        HandOver.decode(b'{"module":"m","args":[1],"env":{},"run_id":"r","worker":"w"}\n')


def test_an_idle_standby_is_no_job_and_a_handed_one_is_its_job() -> None:
    name = standby_name(0, "abc123")
    labels = {LABEL_STANDBY: "0", "specon.io/managed": "true"}
    assert idle_standby(labels, name) and job_of(labels, name) is None
    assert job_of(labels, "job-7") == "job-7"  # renamed to the job it was handed
    assert not idle_standby({}, name) and job_of({}, name) == name  # no label: an ordinary container


def test_the_standby_container_has_one_gpu_no_privilege_and_a_read_only_socket_directory() -> None:
    kwargs = standby_kwargs(CONFIG, "train:1", 1, name="sb", socket_dir=Path("/run/sb/x"))
    assert kwargs["network_mode"] == "none" and kwargs["labels"][LABEL_STANDBY] == "1"
    assert not {"privileged", "cap_add", "devices", "pid_mode"} & set(kwargs)
    assert kwargs["volumes"] == {
        "/datasets": {"bind": "/datasets", "mode": "ro"},
        "/run/sb/x": {"bind": SOCKET_DIR_INSIDE, "mode": "ro"},
    }
    (req,) = kwargs["device_requests"]
    assert req["Driver"] == "nvidia" and req["DeviceIDs"] == ["1"] and req["Capabilities"] == [["gpu"]]
    assert "device_requests" not in standby_kwargs(
        replace(CONFIG, gpu_devices=False), "t", 0, name="s", socket_dir=Path("/x")
    )
    cmd = server_command(replace(CONFIG, prime=False), 1)
    assert cmd[0] == PY and cmd[-1] == "--no-prime" and cmd[cmd.index("--module") + 1] == "specon.workloads"


def test_cpu_limits_become_a_quota_and_are_reported_back() -> None:
    assert cpu_limits(recipe()) == {"cpu_period": 100_000, "cpu_quota": 200_000}
    assert cpu_limits(recipe(nano_cpus=None, cpu_shares=512)) == {"cpu_shares": 512}
    c = SimpleNamespace(
        id="c1",
        status="running",
        attrs={"HostConfig": {"CpuQuota": 50_000, "CpuPeriod": 100_000}, "State": {}},
    )
    spec_ = SimpleNamespace()
    info = container_info(
        "j",
        c,
        worker="w",
        spec=spec_,
        paths=JobPaths(Path("/v"), "j"),
        busy=None,
        started=12.0,  # type: ignore[arg-type]
    )
    assert info.cpu_limit == 0.5 and info.started_at == 12.0


def _dir_fd(path: Path) -> tuple[int, bool]:
    """A detached clone where this process may make one (root), else a plain descriptor."""
    try:
        return detached_clone(path), True
    except OSError:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY), False


def test_take_enters_the_directory_and_refuses_what_it_does_not_run(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j1"
    job.mkdir(parents=True)
    (job / "mark").write_text("x")
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    req = HandOver("json.tool", (), {}, "r", "w").encode()
    try:
        fd, _ = _dir_fd(job)
        assert take(req, [fd], frozenset({"json.tool"})).module == "json.tool"
        assert os.listdir(".") == ["mark"]
    finally:
        os.fchdir(here)
        os.close(here)
    fd, _ = _dir_fd(job)
    with pytest.raises(HandOverError, match="not one this standby runs"):
        take(req, [fd], frozenset({"specon.workloads"}))
    with pytest.raises(OSError):
        os.fstat(fd)  # closed either way
    with pytest.raises(HandOverError, match="one descriptor"):
        take(req, [], frozenset({"json.tool"}))
    r, w = os.pipe()
    os.close(w)
    with pytest.raises(HandOverError, match="not a directory"):
        take(req, [r], frozenset({"json.tool"}))


def test_from_a_detached_clone_dotdot_goes_nowhere(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j1"
    job.mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    try:
        fd = detached_clone(job)
    except OSError as exc:
        pytest.skip(f"needs CAP_SYS_ADMIN and Linux >= 5.2 for open_tree: {exc}")
    try:
        assert os.listdir(f"/proc/self/fd/{fd}/../..") == os.listdir(job)
        # A plain descriptor is what it must never be: it walks up to the host's tree.
        plain = os.open(job, os.O_RDONLY | os.O_DIRECTORY)
        assert "secret" in os.listdir(f"/proc/self/fd/{plain}/../..")
        os.close(plain)
    finally:
        os.close(fd)


SERVE = "import sys; from specon.runtime.docker.standby_server import main; sys.exit(main(sys.argv[1:]))"


def _standby(tmp_path: Path, module: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
    path = tmp_path / "s"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    srv.settimeout(30)
    argv = [sys.executable, "-c", SERVE, str(path), "--module", module, "--preload", "json", "--no-prime"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    conn, _ = srv.accept()
    srv.close()
    conn.settimeout(30)
    assert json.loads(conn.recv(4096))["ready"] is True
    return proc, conn


@pytest.mark.slow
def test_the_server_becomes_the_job_in_its_directory_with_its_exit_status(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "in.json").write_text('{"a": 1}')
    proc, conn = _standby(tmp_path, "json.tool")
    fd, _ = _dir_fd(job)
    req = HandOver("json.tool", ("in.json", "out.json"), {"X": "1"}, "r", "w")
    conn.sendmsg([req.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    os.close(fd)
    reply = json.loads(conn.recv(4096))
    assert isinstance(reply["pid"], int)
    conn.close()
    assert proc.wait(30) == 0
    assert json.loads((job / "out.json").read_text()) == {"a": 1}  # relative to its directory


@pytest.mark.slow
def test_the_keeper_forwards_sigterm_and_a_refused_request_or_a_gone_agent_ends_it(tmp_path: Path) -> None:
    proc, conn = _standby(tmp_path, "http.server")
    fd, _ = _dir_fd(tmp_path)
    req = HandOver("http.server", ("--bind", "127.0.0.1", "0"), {}, "r", "w")
    conn.sendmsg([req.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    os.close(fd)
    assert isinstance(json.loads(conn.recv(4096))["pid"], int)
    proc.send_signal(15)  # to the keeper, as the engine sends it
    assert proc.wait(30) == 128 + 15
    (tmp_path / "s").unlink()
    proc, conn = _standby(tmp_path, "http.server")
    conn.sendall(HandOver("evil", (), {}, "r", "w").encode())
    assert "not one this standby runs" in json.loads(conn.recv(4096))["error"]
    assert proc.wait(30) == 1
    (tmp_path / "s").unlink()
    proc, conn = _standby(tmp_path, "http.server")
    conn.close()  # the agent is gone: the idle standby ends
    assert proc.wait(30) == 0
