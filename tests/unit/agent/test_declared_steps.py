"""A job that declares its total steps in its progress log (the framework integrations do:
a framework knows its total only once it runs) is treated as if its spec had declared it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specon_agent.watched import FIRST_RECORD_BYTES, first_record_steps

from specon.model import ContainerId
from specon.wire.protocol import STEPS_LABEL
from tests.unit.agent.test_core import World, tick
from tests.unit.agent.test_core import world as world  # noqa: PLC0414 - the fixture


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"event": "started", "step": 0, "steps": 300}\n{"step": 1, "loss": 2.0}\n', (300, True)),
        ('{"event": "started", "step": 0, "steps": 300', (None, False)),  # not yet whole: ask again
        ('{"event": "started", "step": 0}\n', (None, True)),
        ('{"step": 1, "loss": 2.0, "steps": 300}\n', (None, True)),  # not a start record
        ('{"event": "started", "steps": true}\n', (None, True)),
        ('{"event": "started", "steps": -4}\n', (None, True)),
        ('{"event": "started", "steps": 1e30}\n', (None, True)),
        (f'{{"event": "started", "steps": {2**70}}}\n', (None, True)),
        ("not json\n", (None, True)),
        ("", (None, False)),
    ],
)
def test_the_first_record_declares_the_total(
    tmp_path: Path, text: str, expected: tuple[int | None, bool]
) -> None:
    assert first_record_steps(write(tmp_path / "progress.jsonl", text)) == expected


def test_a_first_line_too_long_declares_nothing_and_is_not_read_again(tmp_path: Path) -> None:
    path = write(tmp_path / "progress.jsonl", "x" * (FIRST_RECORD_BYTES + 10))
    assert first_record_steps(path) == (None, True)
    assert first_record_steps(tmp_path / "missing.jsonl") == (None, False)


async def test_the_agent_takes_the_declared_total_where_the_spec_has_none(world: World) -> None:
    paths = world.volume.paths(ContainerId("fw"))
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.progress.write_text(json.dumps({"event": "started", "step": 0, "steps": 500}) + "\n")
    await world.run("fw")  # no steps in its spec
    await world.run("plain")
    agent = world.agent()
    await agent.refresh()
    await tick(agent, world.clock)
    assert agent.watched[ContainerId("fw")].info.spec.steps == 500
    assert agent.watched[ContainerId("plain")].info.spec.steps is None
    beat = agent.heartbeat(world.clock.now())
    jobs = {c.id: c.job for c in beat.containers}
    assert jobs[ContainerId("fw")][STEPS_LABEL] == "500" and STEPS_LABEL not in jobs[ContainerId("plain")]
