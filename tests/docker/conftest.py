"""Fixtures for tests against real Docker engines (see engines.py).

- ``docker_engines`` (session): two running engines, ``host-1`` and ``host-2``, each its own
  ``dockerd``; their containers are removed after every test that used them.
- ``docker_engine`` (function): the first of them.
- ``python_images`` (session): the host-Python image imported into both; its tag.

Engine state lives in a short directory under /tmp (socket paths are limited to 108 bytes)
and is removed at the end of the session.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.engines import (
    DockerUnavailable,
    Engine,
    python_image,
    remove_managed,
    start_engine,
    stop_engine,
)


@pytest.fixture(scope="session")
def _engines() -> Iterator[tuple[Engine, Engine]]:
    base = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    started: list[Engine] = []
    try:
        for name in ("host-1", "host-2"):
            started.append(start_engine(name, base / name[-1]))
    except DockerUnavailable as err:
        for e in started:
            stop_engine(e)
        shutil.rmtree(base, ignore_errors=True)
        pytest.skip(f"no Docker engine here: {err}")
    try:
        yield started[0], started[1]
    finally:
        for e in started:
            stop_engine(e)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def docker_engines(_engines: tuple[Engine, Engine]) -> Iterator[tuple[Engine, Engine]]:
    yield _engines
    for e in _engines:
        remove_managed(e)


@pytest.fixture
def docker_engine(docker_engines: tuple[Engine, Engine]) -> Engine:
    return docker_engines[0]


@pytest.fixture(scope="session")
def python_images(_engines: tuple[Engine, Engine]) -> str:
    tags = {python_image(e) for e in _engines}
    (tag,) = tags
    return tag
