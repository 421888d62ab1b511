"""docs/reference.md is what ``specon config reference`` prints: every policy key and setting."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specon.cli.main import main
from specon.cli.reference import REGENERATE, reference_markdown
from specon.config import default_policy, policy_to_dict
from specon.daemon.settings import AgentSettings, ManagerSettings

PAGE = Path(__file__).resolve().parents[3] / "docs" / "reference.md"


def test_the_committed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == reference_markdown(), f"regenerate it: {REGENERATE}"


def test_the_command_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == reference_markdown()


def _keys(data: dict[str, object], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out += _keys(value, path + ".") if isinstance(value, dict) else [path]
    return out


def test_every_policy_key_and_every_setting_is_documented() -> None:
    page = reference_markdown()
    data = policy_to_dict(default_policy())
    keys = [k for k in _keys(data) if "." in k]  # apiVersion, kind and mode are in the prose
    assert keys and all(f"| `{k}` |" in page for k in keys)
    for cls in (AgentSettings, ManagerSettings):
        for f in dataclasses.fields(cls):
            assert f"| `{cls.variable(f.name)}` | {f.default:g} |" in page
