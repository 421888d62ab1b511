"""The daemons' operational settings (specon.daemon.settings): defaults, environment, checks, docs."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from specon_manager.app import SETTINGS, create_app
from specon_manager.status import DEFAULT_LIMIT, MAX_LIMIT, BadPageError, Page

from specon.daemon.settings import AgentSettings, ManagerSettings, SettingsError
from specon.model import WorkerId
from specon.wire import protocol
from specon.wire.protocol import Poll
from tests.unit.manager_fakes import START, FakeClock, shell

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "settings-test-token"


def test_the_defaults_are_the_values_the_daemons_had_before() -> None:
    a, m = AgentSettings(), ManagerSettings()
    assert (a.poll_wait, a.poll_timeout_margin, a.request_timeout, a.shutdown_timeout) == (20, 10, 10, 3)
    assert (a.backoff_initial, a.backoff_max, a.crash_pause) == (0.5, 30, 1)
    assert (a.first_record_timeout, a.result_memory) == (120, 1000)
    assert (m.ticker_period, m.max_poll_wait, m.status_ttl, m.status_cache_size) == (1, 60, 1, 256)
    assert (m.status_page_limit, m.status_page_max, m.shutdown_timeout) == (1000, 10_000, 5)
    assert (DEFAULT_LIMIT, MAX_LIMIT) == (1000, 10_000)


def test_an_empty_environment_gives_the_defaults() -> None:
    assert AgentSettings.from_env({}) == AgentSettings()
    assert ManagerSettings.from_env({"PATH": "/bin", "SPECON_TOKEN": "x"}) == ManagerSettings()


def test_variables_override_their_settings() -> None:
    env = {
        "SPECON_AGENT_POLL_WAIT": " 45 ",
        "SPECON_AGENT_BACKOFF_MAX": "1e2",
        "SPECON_AGENT_RESULT_MEMORY": "50",
        "SPECON_AGENT_CRASH_PAUSE": "0",
        "SPECON_MANAGER_POLL_WAIT": "1",  # another daemon's prefix: not the agent's
    }
    s = AgentSettings.from_env(env)
    assert (s.poll_wait, s.backoff_max, s.result_memory, s.crash_pause) == (45.0, 100.0, 50, 0.0)
    assert isinstance(s.result_memory, int)
    assert dataclasses.replace(s, poll_wait=20.0, backoff_max=30.0, result_memory=1000, crash_pause=1.0) == (
        AgentSettings()
    )
    m = ManagerSettings.from_env({"SPECON_MANAGER_TICKER_PERIOD": "0.25", "SPECON_MANAGER_STATUS_TTL": "0"})
    assert (m.ticker_period, m.status_ttl) == (0.25, 0.0)


def test_the_variables_are_named_after_the_settings() -> None:
    assert AgentSettings.variable("poll_wait") == "SPECON_AGENT_POLL_WAIT"
    assert ManagerSettings.variable("status_ttl") == "SPECON_MANAGER_STATUS_TTL"


def test_every_bad_value_is_reported_at_once_under_its_variable() -> None:
    env = {
        "SPECON_AGENT_POLL_WAIT": "soon",
        "SPECON_AGENT_REQUEST_TIMEOUT": "-1",
        "SPECON_AGENT_SHUTDOWN_TIMEOUT": "0",
        "SPECON_AGENT_BACKOFF_INITIAL": "nan",
        "SPECON_AGENT_FIRST_RECORD_TIMEOUT": "inf",
        "SPECON_AGENT_RESULT_MEMORY": "1.5",
        "SPECON_AGENT_CRASH_PAUSE": "-0.5",
    }
    with pytest.raises(SettingsError) as err:
        AgentSettings.from_env(env)

    assert err.value.errors == (
        "SPECON_AGENT_POLL_WAIT: expected a number, got 'soon'",
        "SPECON_AGENT_REQUEST_TIMEOUT: must be > 0, got -1.0",
        "SPECON_AGENT_SHUTDOWN_TIMEOUT: must be > 0, got 0.0",
        "SPECON_AGENT_BACKOFF_INITIAL: expected a finite number, got nan",
        "SPECON_AGENT_CRASH_PAUSE: must be >= 0, got -0.5",
        "SPECON_AGENT_FIRST_RECORD_TIMEOUT: expected a finite number, got inf",
        "SPECON_AGENT_RESULT_MEMORY: expected an integer, got '1.5'",
    )
    assert str(err.value).startswith("invalid settings: 7 errors\n  SPECON_AGENT_POLL_WAIT: ")
    assert isinstance(err.value, ValueError)


def test_rules_between_settings_name_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"SPECON_AGENT_BACKOFF_MAX: must be >= backoff_initial \(5"):
        AgentSettings.from_env({"SPECON_AGENT_BACKOFF_INITIAL": "5", "SPECON_AGENT_BACKOFF_MAX": "2"})
    with pytest.raises(SettingsError, match="SPECON_MANAGER_STATUS_PAGE_LIMIT: must be <= status_page_max"):
        ManagerSettings.from_env({"SPECON_MANAGER_STATUS_PAGE_LIMIT": "20000"})
    assert (
        ManagerSettings.from_env(
            {"SPECON_MANAGER_STATUS_PAGE_LIMIT": "20000", "SPECON_MANAGER_STATUS_PAGE_MAX": "50000"}
        ).status_page_max
        == 50_000
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"poll_wait": 0.0}, "poll_wait: must be > 0, got 0.0"),
        ({"poll_wait": float("nan")}, "poll_wait: expected a finite number, got nan"),
        ({"backoff_max": True}, "backoff_max: expected a finite number, got True"),
        ({"result_memory": 0}, "result_memory: must be > 0, got 0"),
        ({"result_memory": 10.0}, "result_memory: expected an integer, got 10.0"),
        (
            {"backoff_initial": 2.0, "backoff_max": 1.0},
            "backoff_max: must be >= backoff_initial (2.0), got 1.0",
        ),
    ],
)
def test_constructing_settings_checks_the_same_rules(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(SettingsError) as err:
        AgentSettings(**kwargs)  # type: ignore[arg-type]
    assert err.value.errors == (error,)


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AgentSettings().poll_wait = 1.0  # type: ignore[misc]


def test_unknown_variables_are_listed_with_the_nearest_setting() -> None:
    env = {
        "SPECON_AGENT_POLLWAIT": "5",
        "SPECON_AGENT_POLL_WAIT": "5",
        "SPECON_AGENT_ZZZ": "1",
        # A Service named specon-agent makes Kubernetes set these: not settings, not typos.
        "SPECON_AGENT_SERVICE_HOST": "10.0.0.1",
        "SPECON_AGENT_PORT": "tcp://10.0.0.1:7701",
        "SPECON_AGENT_PORT_7701_TCP_ADDR": "10.0.0.1",
        "SPECON_TOKEN": "x",
    }
    assert AgentSettings.unknown_variables(env) == [
        "SPECON_AGENT_POLLWAIT (did you mean SPECON_AGENT_POLL_WAIT?)",
        "SPECON_AGENT_ZZZ",
    ]
    assert ManagerSettings.unknown_variables(env) == []


def test_the_reference_documents_every_setting_with_its_variable_and_default() -> None:
    page = (ROOT / "docs" / "reference.md").read_text()
    rows = {
        m["var"]: m["default"]
        for m in re.finditer(r"^\| `(?P<var>SPECON_\w+)` \| (?P<default>[^|]+?) \|", page, re.M)
    }
    documented = {
        var: default for cls in (AgentSettings, ManagerSettings) for _, var, default, _ in cls.documented()
    }
    assert set(rows) == set(documented)
    for var, default in documented.items():
        assert float(rows[var]) == default, var


def test_the_manager_app_uses_its_settings_for_status_pages() -> None:
    settings = ManagerSettings(status_page_limit=5, status_page_max=50)
    assert Page.parse(None, None, settings).limit == 5
    assert Page.parse("50", None, settings).limit == 50
    with pytest.raises(BadPageError, match=r"within \[1, 50\]"):
        Page.parse("51", None, settings)
    assert Page.parse(None, None).limit == DEFAULT_LIMIT


async def test_the_manager_app_serves_with_its_settings(tmp_path: Path) -> None:
    coord = shell(tmp_path, FakeClock())
    settings = ManagerSettings(max_poll_wait=0.0, status_page_max=50, status_page_limit=50)
    app = create_app(coord, token=TOKEN, tick=False, settings=settings)
    assert app[SETTINGS] is settings
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(protocol.STATUS_PATH, params={"limit": "51"})
        assert resp.status == 400 and "within [1, 50]" in (await resp.text())
        # A poll held at most max_poll_wait: 0 s, however long the agent asks to wait.
        poll = Poll(worker=WorkerId("w0"), sent_at=START, wait=30.0)
        headers = {protocol.AUTH_HEADER: f"Bearer {TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
        resp = await asyncio.wait_for(
            client.post(protocol.POLL_PATH, data=protocol.encode(poll), headers=headers), 10.0
        )
        assert resp.status == 200
    coord.journal.close()
    assert create_app(shell(tmp_path, FakeClock()), token=TOKEN)[SETTINGS] == ManagerSettings()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "variable"),
    [("specon_agent", "SPECON_AGENT_POLL_WAIT"), ("specon_manager", "SPECON_MANAGER_TICKER_PERIOD")],
)
def test_a_daemon_refuses_to_start_with_a_bad_setting(tmp_path: Path, module: str, variable: str) -> None:
    env = {**os.environ, variable: "-3", "SPECON_TOKEN": "t" * 40}
    args = (
        ["--volume", str(tmp_path), "--worker", "w0"]
        if module == "specon_agent"
        else ["--state-dir", str(tmp_path)]
    )
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{variable}: must be > 0, got -3.0" in done.stderr
