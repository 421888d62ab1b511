"""The boundary rules for names: the one id rule, and the Kubernetes DNS label and label value."""

from __future__ import annotations

import re

import pytest

from specon.wire.validate import (
    DNS_LABEL,
    ID_REGEX,
    ID_RULE,
    LABEL_VALUE,
    InvalidIdError,
    is_valid_id,
    valid_id,
)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("job-1", True),
        ("A.b_c-9", True),
        ("a" * 253, True),
        ("a" * 254, False),
        ("", False),
        (".", False),
        ("..", False),
        ("-a", False),
        ("a/b", False),
        ("job\n", False),
        ("\ud800", False),
        (3, False),
    ],
)
def test_the_id_rule(value: object, ok: bool) -> None:
    assert is_valid_id(value) is ok
    if ok:
        assert valid_id(value) == value
    else:
        with pytest.raises(InvalidIdError, match=rf"^invalid worker id .*: use {re.escape(ID_RULE)}$"):
            valid_id(value, what="worker id")


def test_the_id_expression_is_the_rule_and_portable() -> None:
    """``ID_REGEX`` is what the OpenAPI document anchors as an ECMA-262 pattern: a plain class
    and a bounded repeat, nothing Python-only."""
    assert re.fullmatch(r"\[[^\]]+\]\[[^\]]+\]\{0,\d+\}", ID_REGEX)
    assert ID_RULE == "1-253 of [A-Za-z0-9._-], starting alphanumeric"


@pytest.mark.parametrize(
    ("name", "label", "value"),
    [
        ("a", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, False),
        ("a-b", True, True),
        ("-a", False, False),
        ("a-", False, False),
        ("A", False, True),
        ("a.b", False, True),
        ("a_b", False, True),
        ("", False, True),  # a label value may be empty
    ],
)
def test_kubernetes_dns_label_and_label_value(name: str, label: bool, value: bool) -> None:
    assert (DNS_LABEL.fullmatch(name) is not None) is label
    assert (LABEL_VALUE.fullmatch(name) is not None) is value
