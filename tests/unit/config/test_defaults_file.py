"""``examples/policy.yaml`` says it holds every knob at its default: keep it so."""

from __future__ import annotations

from pathlib import Path

from specon.config import default_policy, policy_to_yaml

ROOT = Path(__file__).resolve().parents[3]


def _body(text: str) -> str:
    """The file without its leading comment block."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    return "".join(lines[start:])


def test_the_example_policy_is_every_default_as_specon_config_defaults_prints_it() -> None:
    example = (ROOT / "examples" / "policy.yaml").read_text(encoding="utf-8")
    assert _body(example) == _body(policy_to_yaml(default_policy())), (
        "regenerate examples/policy.yaml from `specon config defaults` (keep its header) "
        "and copy it to manifests/base/policy.yaml"
    )
