"""The status page and ``specon status`` on a running cluster: real manager and agent processes
(the embedded cluster, on loopback), real jobs logging their loss, a real migration.

The page is read in headless Chromium (``cdp_client``; Debian's ``chromium``, installed when
missing where that is possible) as a person would: the login form, the read token typed in,
then a card per job with its loss curve (drawn from the window its agent sent), a progress bar
against its declared steps with the time left, its category history and its move. The same
cluster is read with ``specon status`` (the table, ``--json``, and a wrong and an agent's
token). The demo's own use of the page (its address printed, the page kept at its busiest and
rendered to a PNG) runs ``run_once`` on the same jobs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from cdp_client import CDP, Chromium
from manager_proc import chromium_or_skip

from specon.embedded import demo
from specon.embedded.cluster import EmbeddedCluster
from specon.model import WorkerId
from specon.wire import protocol
from specon.wire.status import Status
from tests.integration.test_e2e_local import POLICY, job

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1800)]

SPECON = Path(sys.executable).with_name("specon")
W0, W1 = WorkerId("w0"), WorkerId("w1")


async def wait_for(cond: Callable[[], Awaitable[bool]], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    with chromium_or_skip(tmp_path_factory.mktemp("chromium")) as browser:
        yield browser


def specon_status(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}  # no SPECON_TOKEN from the caller's environment
    argv_ = [str(SPECON), "status", *argv]
    return subprocess.run(argv_, capture_output=True, text=True, timeout=60, env=env, check=False)


# A card as the browser shows it: its id, how many points its curve has, its bar's width, its text.
CARDS = """Array.from(document.querySelectorAll('section.job')).map(s => ({
  id: s.id,
  points: (s.querySelector('svg.curve polyline') || {getAttribute: () => ''}).getAttribute('points')
          .split(' ').filter(p => p).length,
  curveWidth: s.querySelector('svg.curve').getBoundingClientRect().width,
  bar: s.querySelector('.prog span') ? s.querySelector('.prog span').getBoundingClientRect().width : null,
  strip: s.querySelectorAll('.bar span').length,
  text: s.innerText,
}))"""


async def test_a_running_cluster_s_page_shows_curves_bars_and_moves_and_specon_status_the_table(
    chromium: Chromium, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    async with EmbeddedCluster(tmp_path / "c", workers=2, cpus_per_worker=0.5, policy=policy) as cluster:
        await cluster.submit(job("fast", 1500, "converge"), W0)  # converges, and is moved to w1
        await cluster.submit(job("steady", 3000, "linear"), W0)
        await cluster.submit(job("other", 3000, "linear"), W1)
        assert cluster.manager is not None
        url, read = cluster.manager.url, cluster.tokens_dir / "read"

        async def ready() -> bool:
            st: Status = await cluster.status()
            moved = any(m.container == "fast" and m.state.value == "done" for m in st.migrations)
            curves = {c.id for c in st.containers if c.window is not None and len(c.window.loss) >= 3}
            timed = {c.id for c in st.containers if c.eta is not None and c.phase == "running"}
            return moved and curves >= {"fast", "steady", "other"} and timed >= {"steady", "other"}

        await wait_for(ready, "every job's curve and time left, and the converged job's move")

        # -- specon status: the table, the JSON, and the tokens it does not take ----------------
        done = specon_status("--manager", url, "--token-file", str(read))
        assert done.returncode == 0, done.stderr
        rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
        assert rows["WORKER"][:3] == ["WORKER", "AGENT", "REACHABLE"] and rows["w0"][2] == "yes"
        steady = rows["steady"]
        assert steady[1:3] == ["progressing", "running"] and steady[3].endswith("/3000")
        assert steady[4].endswith("%") and steady[5][-1] in "sm" and steady[6] == "w0"  # an ETA
        assert rows["fast"][rows["fast"].index("w1") + 1] == "1"  # migrated once, now on w1
        done = specon_status("--manager", url, "--token-file", str(read), "--json", "--limit", "2")
        page = protocol.decode(done.stdout, Status)
        assert done.returncode == 0 and page.next is not None and page.total_containers == 3
        wrong = tmp_path / "wrong"
        wrong.write_text("not-the-token-" + "0" * 30)
        done = specon_status("--manager", url, "--token-file", str(wrong))
        assert done.returncode == 1 and "(401: missing or wrong bearer token)" in done.stderr
        assert "--read-token-file" in done.stderr
        done = specon_status("--manager", url, "--token-file", str(cluster.tokens_dir / "agent-w0"))
        assert done.returncode == 1 and "(403:" in done.stderr and "use its read token" in done.stderr

        # -- the page, in a browser --------------------------------------------------------------
        async with CDP.connect(chromium.ws_url) as cdp, cdp.page() as tab:
            await tab.navigate(f"{url}/")
            await tab.wait_for("!!document.querySelector('form[action=\"/login\"] input[name=token]')")
            await tab.type_text("#token", read.read_text().strip())
            await tab.click("#login")
            await tab.wait_for("document.querySelectorAll('section.job svg.curve polyline').length >= 3")
            cards = {c["id"]: c for c in await tab.evaluate(CARDS)}
            assert set(cards) == {"job-fast", "job-steady", "job-other"}
            for c in cards.values():
                assert c["points"] >= 3 and c["curveWidth"] > 100 and c["strip"] >= 1, c
            for name in ("job-steady", "job-other"):
                card = cards[name]
                assert card["bar"] is not None and card["bar"] > 0, card
                assert "/ 3,000 steps" in card["text"] and " left" in card["text"], card["text"]
            assert "w0 → w1 · converged · done" in cards["job-fast"]["text"]
            assert "migrations 1" in cards["job-fast"]["text"]
            # The workers list each job as a chip that leads to its card.
            chips = await tab.evaluate("Array.from(document.querySelectorAll('a.chip')).map(a => a.hash)")
            assert sorted(chips) == ["#job-fast", "#job-other", "#job-steady"]
            await tab.screenshot(tmp_path / "status-page.png")
        assert (tmp_path / "status-page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_the_demo_says_where_its_page_is_and_keeps_it_for_a_screenshot(
    chromium: Chromium, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    jobs = [demo.DemoJob("job-01", "vae", 0.0, 300, 1), demo.DemoJob("job-02", "gru", 0.5, 300, 2)]
    said: list[str] = []
    keeper = demo.PageKeeper()
    monkeypatch.setattr(demo, "PAGE_EVERY", 1.0)
    result = await demo.run_once(
        jobs,
        root=tmp_path / "run",
        workers=2,
        cpus_per_worker=0.5,
        with_specon=True,
        policy=policy,
        say=said.append,
        deadline=240.0,
        label="specon",
        page=keeper,
        # The demo's jobs as this suite's torch-free job (the demo trains real models on torch,
        # and its warm interpreters import torch: minutes of CPU on a loaded machine).
        spec_of=lambda j: job(j.id, j.steps, "converge"),
        warm=False,
    )
    assert all(j.finish is not None for j in result.jobs), said
    (line,) = [s for s in said if "status page:" in s]
    token = tmp_path / "run" / "tokens" / "read"
    assert f"and paste the token from {token}" in line and "specon status --manager http://127.0.0.1:" in line
    assert keeper.html is not None and keeper.curves >= 1
    assert keeper.html.count(b"<polyline") >= keeper.curves and b'action="/logout"' not in keeper.html
    shot = tmp_path / "out" / "status-page.png"
    shot.parent.mkdir()
    assert demo.screenshot(keeper.html, shot) is None
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == demo.SHOT_WINDOW
    json.dumps(said)  # every line is text
