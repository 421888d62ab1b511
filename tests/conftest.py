"""Markers that follow from where a test lives, so none is left off by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Folder -> the markers of every test in it.
FOLDER_MARKERS = {
    "integration": ("integration",),
    "docker": ("integration", "docker"),
    "k8s": ("integration", "k8s"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            folder = item.path.resolve().relative_to(HERE).parts[0]
        except ValueError:
            continue
        for name in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(name)


# The network hosts fixture (tests/hosts.py), for every folder.
from tests.hosts import net_hosts  # noqa: E402, F401
