"""The local runtime names itself in its worker labels, so the manager learns its move costs apart."""

from __future__ import annotations

import os
from pathlib import Path

from specon.model import RUNTIME_LABEL, WorkerId
from specon.policy.move_costs import backend_of
from specon.runtime.local.backend import LocalRuntime


def test_local_runtime_labels_name_the_backend(tmp_path: Path) -> None:
    # A cluster name of this process: the runtime may make cgroups, shared by every test run.
    rt = LocalRuntime(tmp_path, WorkerId("w0"), 1.0, cluster=f"labels{os.getpid()}")
    try:
        assert rt.node_labels == {RUNTIME_LABEL: "local"}
        assert backend_of(rt.node_labels) == "local"
    finally:
        assert rt.close()
