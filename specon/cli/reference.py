"""The reference page (docs/reference.md), generated from the code: every key of the policy
file and every operational setting of the daemons, with its default and meaning.

``specon config reference`` prints it; a test keeps the committed page equal to it, so the
page never falls behind the code.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from specon.config import API_VERSION, DOCS, KIND, Policy, default_policy, policy_to_dict
from specon.daemon.settings import AgentSettings, ManagerSettings

REGENERATE = "specon config reference > docs/reference.md"


def reference_markdown() -> str:
    """The whole page, as Markdown."""
    lines = [
        "# Reference: the policy file and the daemons' settings",
        "",
        f"Generated from the code by `{REGENERATE}`; a test keeps it current.",
        "",
        "## The policy file",
        "",
        f"A YAML file with `apiVersion: {API_VERSION}` and `kind: {KIND}`; every other key may be left",
        "out to take its default. `mode: paper` starts from the values that reproduce the SpeCon",
        "paper's printed behaviour (the *paper* column) before the file's own values apply.",
        "`specon config defaults` prints a complete, commented file; `specon config validate FILE`",
        "checks one and lists every problem. The behaviour behind each key is in [SPEC.md](SPEC.md).",
        "",
    ]
    default = policy_to_dict(default_policy("default"))
    paper = policy_to_dict(default_policy("paper"))
    hints = typing.get_type_hints(Policy)
    for f in dataclasses.fields(Policy):
        if not dataclasses.is_dataclass(hints[f.name]):
            continue
        lines += [f"### `{f.name}`", ""]
        if doc := DOCS.get(f.name):
            lines += [_sentence(doc), ""]
        lines += ["| key | default | paper | allowed | meaning |", "|---|---|---|---|---|"]
        for path, tp in _leaves(hints[f.name], (f.name,)):
            key = ".".join(path)
            d, p = _value(default, path), _value(paper, path)
            paper_cell = "" if p == d else _code(p)
            meaning = _cell(DOCS.get(key, ""))
            lines.append(f"| `{key}` | {_code(d)} | {paper_cell} | {_allowed(tp)} | {meaning} |")
        lines.append("")
    lines += [
        "## The daemons' operational settings",
        "",
        "How long, how often, how much: never what to decide (that is the policy file). Each is read",
        "from its environment variable; a bad value stops the daemon with every problem listed, and",
        "an unknown variable with the daemon's prefix is logged with the nearest known one.",
        "",
    ]
    for title, cls in (("`specon-agent`", AgentSettings), ("`specon-manager`", ManagerSettings)):
        lines += [f"### {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for _name, variable, value, doc in cls.documented():
            lines.append(f"| `{variable}` | {value:g} | {_cell(doc)} |")
        lines.append("")
    return "\n".join(lines)


def _leaves(cls: type[Any], path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], object]]:
    """Every non-section field below ``cls``, depth first, in declaration order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f.metadata.get("key", f.name)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from _leaves(tp, (*path, key))
        else:
            yield (*path, key), tp


def _value(data: Mapping[str, Any], path: tuple[str, ...]) -> object:
    node: Any = data
    for part in path:
        node = node[part]
    return node


def _allowed(tp: object) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return ", ".join(f"`{m.value}`" for m in tp)
    if typing.get_origin(tp) is typing.Literal:
        return ", ".join(f"`{a}`" for a in typing.get_args(tp))
    return _cell(_type_name(tp))


def _type_name(tp: object) -> str:
    if tp is bool:
        return "true/false"
    names: dict[object, str] = {int: "integer", float: "number", str: "text"}
    if tp in names:
        return names[tp]
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple:
        return f"list of {_type_name(args[0])}" if args else "list"
    if type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in rest) + " or null"
    return getattr(tp, "__name__", str(tp))


def _code(value: object) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(str(v) for v in value) + "]"
    else:
        text = str(value)
    return f"`{_cell(text)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."
