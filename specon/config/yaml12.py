"""specon's one YAML loader and dumper: the YAML 1.2 core schema on PyYAML.

PyYAML resolves YAML 1.1 scalars: ``off``/``yes`` are booleans (``rebalance.mode: off``
would be False), ``1e-9`` is a string and ``1:30`` is 90. Policy files, simulator
parameters and token files use the YAML 1.2 core schema instead, for reading and for
writing (the dumper quotes what the loader would misread).
"""

from __future__ import annotations

import re
from typing import Any

import yaml


class YamlError(ValueError):
    """Text the YAML loader refuses; the message says where (line and column) and why."""


def load_yaml(text: str) -> Any:
    """Plain data from YAML text: specon's YAML loader (policy files, simulator parameters).

    The YAML 1.2 core schema (``off``/``yes`` are strings, ``1e-9`` is a number, ``1:30``
    a string), safe types only, and a duplicated key is an error rather than silently the
    last one. Raises ``YamlError`` (a ``ValueError``) naming the line and column.
    """
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        what = ": ".join(part for part in (e.context, e.problem) if part)
        raise YamlError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise YamlError(f"invalid YAML: {e}") from None
    except (ValueError, OverflowError) as e:  # a scalar YAML accepts but Python cannot hold
        raise YamlError(f"invalid YAML value: {e}") from None
    except RecursionError:
        raise YamlError("invalid YAML: nested too deeply") from None


# PyYAML resolves YAML 1.1 scalars: ``off``/``yes`` are booleans (``rebalance.mode: off``
# would be False), ``1e-9`` is a string and ``1:30`` is 90. Policy files use the YAML 1.2
# core schema instead, for reading and for writing (the dumper quotes what the loader
# would misread).

_TAG = "tag:yaml.org,2002:"
_CORE_RESOLVERS = (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
)


class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value!r}",
                        key_node.start_mark,
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


class Dumper(yaml.SafeDumper):
    """Writes what ``load_yaml`` reads back as written."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)


def _use_core_schema(cls: type[yaml.SafeLoader] | type[yaml.SafeDumper]) -> None:
    replaced = {_TAG + name for name in ("bool", "int", "float", "timestamp")}
    cls.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for name, pattern, first in _CORE_RESOLVERS:
        cls.add_implicit_resolver(_TAG + name, re.compile(pattern), list(first))


_use_core_schema(_Loader)
_use_core_schema(Dumper)
_Loader.add_constructor(_TAG + "int", _construct_int)


def scalar_yaml(value: object) -> str:
    # Flow style: a list stays on its key's line (``[100.0, 600.0]``).
    text = yaml.dump(value, Dumper=Dumper, width=1 << 30, default_flow_style=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()
