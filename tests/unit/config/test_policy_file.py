"""The policy file: parsing, generic and semantic validation, defaults, paper mode, YAML output."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.config import (
    API_VERSION,
    DOCS,
    PAPER_OVERRIDES,
    Mode,
    Policy,
    PolicyError,
    default_policy,
    load_policy,
    metric_pattern,
    parse_policy,
    policy_from_dict,
    policy_to_dict,
    policy_to_yaml,
)
from specon.config.yaml12 import YamlError, load_yaml
from specon.model import Direction

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
HEAD = f"apiVersion: {API_VERSION}\nkind: Policy\n"


def errors_of(data: object) -> tuple[str, ...]:
    with pytest.raises(PolicyError) as info:
        policy_from_dict(data)
    return info.value.errors


def with_(section: str, **values: object) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "Policy", section: values}


def only_error(data: object) -> str:
    errors = errors_of(data)
    assert len(errors) == 1, errors
    return errors[0]


# --- defaults and the minimal file ------------------------------------------------------


def test_minimal_file_gives_the_defaults() -> None:
    assert parse_policy(HEAD) == default_policy() == Policy()


def test_defaults_match_spec() -> None:
    p = default_policy()
    assert (p.monitor.interval, p.monitor.alpha, p.monitor.normalize, p.monitor.aggregate) == (
        30.0,
        0.01,
        "max",
        "mean",
    )
    assert (p.placement.weights.progressing, p.placement.weights.watching, p.placement.weights.converged) == (
        2.0,
        1.5,
        1.0,
    )
    assert p.messaging.heartbeat_interval == 5.0
    assert p.rebalance.mode == "balanced"


def test_values_are_read_and_ints_become_floats() -> None:
    p = parse_policy(HEAD + "monitor: {alpha: 0.05, interval: 20}\nplacement: {tolerance: 1e-6}\n")
    assert p.monitor.alpha == 0.05
    assert p.monitor.interval == 20.0 and isinstance(p.monitor.interval, float)
    assert p.placement.tolerance == 1e-6
    # Untouched siblings keep their defaults.
    assert p.monitor.normalize == "max"


def test_enum_field_is_read_by_value() -> None:
    p = parse_policy(HEAD + "progress: {direction: maximize, metric: accuracy}\n")
    assert p.progress.direction is Direction.MAXIMIZE


def test_unknown_mode_rejected_by_default_policy() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        default_policy("fast")  # type: ignore[arg-type]


# --- paper mode ---------------------------------------------------------------------------


def test_paper_mode_applies_every_override() -> None:
    p = parse_policy(HEAD + "mode: paper\n")
    assert p.mode == "paper"
    assert p == default_policy("paper")
    data = policy_to_dict(p)
    for section, values in PAPER_OVERRIDES.items():
        for key, value in values.items():
            assert data[section][key] == value, (section, key)


def test_file_values_win_over_paper_overrides() -> None:
    p = parse_policy(HEAD + "mode: paper\nmonitor: {normalize: max, alpha: 0.1}\n")
    assert p.monitor.normalize == "max"  # overridden by the file
    assert p.monitor.aggregate == "last"  # still the paper's
    assert p.monitor.alpha == 0.1


def test_default_mode_ignores_paper_overrides() -> None:
    assert parse_policy(HEAD + "mode: default\n").monitor.normalize == "max"


# --- round trip and YAML output --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["default", "paper"])
def test_dict_round_trip(mode: Mode) -> None:
    p = default_policy(mode)
    assert policy_from_dict(policy_to_dict(p)) == p


def test_round_trip_of_changed_values() -> None:
    p = parse_policy(
        HEAD
        + "mode: paper\nmonitor: {classifier: robust, robust: {k: 2, n: 5}}\nmigration: {dry_run: true}\n"
        + "rebalance: {mode: off}\n"
    )
    assert policy_from_dict(policy_to_dict(p)) == p
    assert parse_policy(policy_to_yaml(p)) == p
    assert parse_policy(policy_to_yaml(p, comments=False)) == p


def test_api_version_uses_the_file_spelling() -> None:
    data = policy_to_dict(Policy())
    assert data["apiVersion"] == API_VERSION and "api_version" not in data


@pytest.mark.parametrize("mode", ["default", "paper"])
def test_yaml_output_revalidates_and_is_documented(mode: Mode) -> None:
    text = policy_to_yaml(default_policy(mode))
    assert parse_policy(text) == default_policy(mode)
    assert "# threshold alpha" in text
    assert "[balanced | work | paper | off]" in text  # allowed values come from the schema


def test_yaml_output_marks_paper_values() -> None:
    text = policy_to_yaml(default_policy("paper"))
    line = next(x for x in text.splitlines() if x.strip().startswith("normalize:"))
    assert "(default mode: max)" in line


def test_every_field_is_documented() -> None:
    def paths(cls: type[Any], prefix: str = "") -> set[str]:
        out: set[str] = set()
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = prefix + str(f.metadata.get("key", f.name))
            out.add(key)
            if dataclasses.is_dataclass(hints[f.name]):
                out |= paths(hints[f.name], key + ".")
        return out

    assert paths(Policy) == set(DOCS)


@pytest.mark.parametrize("name", ["policy.yaml", "policy-paper.yaml"])
def test_example_files_validate(name: str) -> None:
    p = load_policy(EXAMPLES / name)
    assert p.mode == ("paper" if "paper" in name else "default")


def test_example_default_file_holds_the_defaults() -> None:
    assert load_policy(EXAMPLES / "policy.yaml") == default_policy()


# --- YAML 1.2 scalars ------------------------------------------------------------------------


def test_off_is_a_string_not_false() -> None:
    assert parse_policy(HEAD + "rebalance: {mode: off}\n").rebalance.mode == "off"


def test_yes_is_not_a_boolean() -> None:
    error = only_error(with_("migration", dry_run="yes"))
    assert error.startswith("migration.dry_run: expected true or false")
    with pytest.raises(PolicyError, match=r"migration\.dry_run: expected true or false"):
        parse_policy(HEAD + "migration: {dry_run: yes}\n")


def test_exponent_without_dot_is_a_number() -> None:
    assert parse_policy(HEAD + "placement: {tolerance: 1e-9}\n").placement.tolerance == 1e-9


def test_leading_zero_int_is_decimal() -> None:
    assert parse_policy(HEAD + "monitor: {stale_ticks: 010}\n").monitor.stale_ticks == 10


def test_date_like_value_stays_a_string() -> None:
    assert parse_policy(HEAD + "progress: {metric: 2024-01-01}\n").progress.metric == "2024-01-01"


def test_yaml_syntax_error_reports_the_line() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(HEAD + "monitor:\n  alpha: [1,\n", source="p.yaml")
    (error,) = info.value.errors
    assert error.startswith("line 5,")
    assert str(info.value).startswith("p.yaml: 1 error")


def test_duplicate_key_is_an_error_with_its_line() -> None:
    with pytest.raises(PolicyError, match=r"line 4, column 1: .*duplicate key 'mode'"):
        parse_policy(HEAD + "mode: paper\nmode: default\n")


def test_unrepresentable_yaml_value_is_a_policy_error() -> None:
    with pytest.raises(PolicyError, match="invalid YAML value"):
        parse_policy(HEAD + "monitor: {stale_ticks: " + "9" * 5000 + "}\n")


def test_empty_file_is_an_error() -> None:
    with pytest.raises(PolicyError, match="empty policy"):
        parse_policy("  \n# nothing\n")


def test_unreadable_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(bad)


# --- envelope ----------------------------------------------------------------------------------


def test_api_version_and_kind_are_required() -> None:
    assert errors_of({}) == (
        f"apiVersion: missing; expected '{API_VERSION}'",
        "kind: missing; expected 'Policy'",
    )


def test_wrong_api_version_names_the_supported_one() -> None:
    error = only_error({"apiVersion": "specon/v2", "kind": "Policy"})
    assert error.startswith("apiVersion:") and API_VERSION in error


def test_wrong_kind() -> None:
    assert only_error({"apiVersion": API_VERSION, "kind": "Pod"}) == "kind: must be 'Policy', got 'Pod'"


@pytest.mark.parametrize("data", [None, [], "text", 3])
def test_non_mapping_top_level(data: object) -> None:
    assert only_error(data).startswith("(top level): expected a mapping")


# --- generic type validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "values", "expected"),
    [
        ("monitor", {"alpha": "small"}, "monitor.alpha: expected a number, got string 'small'"),
        ("monitor", {"alpha": True}, "monitor.alpha: expected a number, got boolean True"),
        ("monitor", {"alpha": float("nan")}, "monitor.alpha: must be a finite number, got nan"),
        ("monitor", {"alpha": 10**400}, "monitor.alpha: number is too large"),
        ("monitor", {"stale_ticks": 2.5}, "monitor.stale_ticks: expected an integer, got number 2.5"),
        ("monitor", {"stale_ticks": True}, "monitor.stale_ticks: expected an integer, got boolean True"),
        ("migration", {"dry_run": 1}, "migration.dry_run: expected true or false, got integer 1"),
        ("progress", {"metric": 5}, "progress.metric: expected a string, got integer 5"),
        ("monitor", {"robust": []}, "monitor.robust: expected a mapping, got list"),
    ],
)
def test_type_errors(section: str, values: dict[str, object], expected: str) -> None:
    assert only_error(with_(section, **values)) == expected


def test_literal_error_lists_choices_and_suggests() -> None:
    error = only_error(with_("monitor", normalize="maximum"))
    assert error.startswith("monitor.normalize: must be one of 'max', 'previous', 'none'")
    assert "did you mean 'max'?" in error


def test_enum_error_lists_values() -> None:
    error = only_error(with_("progress", direction="down"))
    assert error.startswith("progress.direction: must be one of 'minimize', 'maximize'")


def test_unknown_key_suggests_the_closest() -> None:
    assert only_error(with_("monitor", alhpa=0.1)) == "monitor.alhpa: unknown key; did you mean 'alpha'?"


def test_unknown_key_without_close_match_lists_known() -> None:
    error = only_error({"apiVersion": API_VERSION, "kind": "Policy", "zebra": 1})
    assert error.startswith("zebra: unknown key (known: apiVersion, kind, mode,")


def test_non_string_key() -> None:
    assert only_error(with_("monitor", **{}) | {"monitor": {1: 2}}).startswith(
        "monitor: keys must be strings, got integer 1"
    )


def test_section_of_wrong_type() -> None:
    assert only_error(with_("placement") | {"placement": 5}) == "placement: expected a mapping, got integer 5"


def test_all_errors_reported_together_in_file_order() -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(
            HEAD
            + "monitor:\n  alpha: -1\n  normalise: max\n"
            + "placement:\n  weights: {watching: 3}\n"
            + "messaging: {heartbeat_interval: fast}\n",
            source="three.yaml",
        )
    paths = [e.split(":")[0] for e in info.value.errors]
    assert paths == [
        "monitor.alpha",
        "monitor.normalise",
        "placement.weights",
        "messaging.heartbeat_interval",
    ]
    text = str(info.value)
    assert text.startswith("three.yaml: 4 errors\n")
    assert "  monitor.alpha: must be > 0, got -1.0" in text


# --- semantic rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "values", "path"),
    [
        ("monitor", {"alpha": 0}, "monitor.alpha"),
        ("monitor", {"alpha": -0.5}, "monitor.alpha"),
        ("monitor", {"interval": 0}, "monitor.interval"),
        ("monitor", {"stale_ticks": -1}, "monitor.stale_ticks"),
        ("monitor", {"request_min_active": -1}, "monitor.request_min_active"),
        ("progress", {"metric": ""}, "progress.metric"),
        ("progress", {"max_line_bytes": 0}, "progress.max_line_bytes"),
        ("placement", {"tolerance": -1e-9}, "placement.tolerance"),
        ("placement", {"max_migrations_per_container": 0}, "placement.max_migrations_per_container"),
        ("rebalance", {"max_rebalances_per_container": -1}, "rebalance.max_rebalances_per_container"),
        ("migration", {"max_concurrent": 0}, "migration.max_concurrent"),
        ("migration", {"max_concurrent_per_worker": 0}, "migration.max_concurrent_per_worker"),
        ("migration", {"grace_period": 0}, "migration.grace_period"),
        ("messaging", {"heartbeat_interval": 0, "worker_timeout": 1}, "messaging.heartbeat_interval"),
        ("messaging", {"worker_timeout": 5}, "messaging.worker_timeout"),
        ("messaging", {"max_body_bytes": 100}, "messaging.max_body_bytes"),
    ],
)
def test_range_rules(section: str, values: dict[str, object], path: str) -> None:
    assert only_error(with_(section, **values)).startswith(f"{path}: must")


@pytest.mark.parametrize(
    ("robust", "path"),
    [
        ({"smoothing": 0}, "monitor.robust.smoothing"),
        ({"smoothing": 1.5}, "monitor.robust.smoothing"),
        ({"k": 0}, "monitor.robust.k"),
        ({"n": 0, "k": 0}, "monitor.robust.k"),
        ({"k": 5, "n": 4}, "monitor.robust.k"),
        ({"trend_window": 1}, "monitor.robust.trend_window"),
        ({"diverge_threshold": 0}, "monitor.robust.diverge_threshold"),
        ({"gain": 0}, "monitor.robust.gain"),
        ({"gain": 1}, "monitor.robust.gain"),
        ({"memory": 0}, "monitor.robust.memory"),
        ({"memory": float("inf")}, "monitor.robust.memory"),
        ({"confirm": -0.1}, "monitor.robust.confirm"),
        ({"confirm": 1.5}, "monitor.robust.confirm"),
    ],
)
def test_robust_rules(robust: dict[str, object], path: str) -> None:
    assert any(e.startswith(f"{path}: must be") for e in errors_of(with_("monitor", robust=robust)))


def test_boundaries_that_are_allowed() -> None:
    # alpha may exceed 1 (normalize: none compares absolute changes); 0 disables stall
    # reports and the request rule; smoothing 1 means none; k may equal n.
    m = policy_from_dict(
        with_(
            "monitor", alpha=5, stale_ticks=0, request_min_active=0, robust={"smoothing": 1, "k": 4, "n": 4}
        )
    ).monitor
    assert (m.alpha, m.stale_ticks, m.request_min_active) == (5.0, 0, 0)
    assert (m.robust.smoothing, m.robust.k, m.robust.n) == (1.0, 4, 4)


def test_robust_test_names_its_choices() -> None:
    assert parse_policy(HEAD + "monitor: {robust: {test: change}}\n").monitor.robust.test == "change"
    assert only_error(with_("monitor", robust={"test": "slope"})).startswith("monitor.robust.test:")


def test_the_default_classifier_is_the_benchmarks_pick_and_paper_mode_keeps_specon() -> None:
    # bench_detection ranks the candidates; paper mode stays Algorithm 1 at alpha 0.01.
    d, paper = default_policy().monitor, default_policy("paper").monitor
    assert (d.classifier, d.robust.test, d.interval) == ("robust", "doubling", 30.0)
    assert (paper.classifier, paper.alpha, paper.normalize, paper.aggregate) == (
        "specon",
        0.01,
        "none",
        "last",
    )


@pytest.mark.parametrize(
    "weights",
    [
        {"progressing": 1, "watching": 1.5, "converged": 1},
        {"progressing": 2, "watching": 2, "converged": 1},
        {"progressing": 2, "watching": 1, "converged": 1},
    ],
)
def test_weights_must_be_strictly_ordered(weights: dict[str, float]) -> None:
    assert only_error(with_("placement", weights=weights)).startswith(
        "placement.weights: must satisfy progressing > watching > converged"
    )


def test_weights_must_be_positive() -> None:
    errors = errors_of(with_("placement", weights={"progressing": 0.5, "watching": 0, "converged": -1}))
    assert errors == (
        "placement.weights.watching: must be > 0, got 0.0",
        "placement.weights.converged: must be > 0, got -1.0",
    )


def test_regex_must_compile() -> None:
    assert only_error(with_("progress", regex="loss ([0-9")).startswith("progress.regex: does not compile")


@pytest.mark.parametrize("regex", ["{metric}: [0-9.]+", "{metric}: ([0-9]+)\\.([0-9]+)"])
def test_regex_needs_exactly_one_group(regex: str) -> None:
    assert "exactly one capture group" in only_error(with_("progress", regex=regex))


def test_regex_may_name_the_value_among_several_groups() -> None:
    regex = r"step (?P<step>\d+) {metric}: (?P<value>[0-9.]+)"
    assert policy_from_dict(with_("progress", regex=regex)).progress.regex == regex


def test_metric_pattern_substitutes_the_escaped_metric() -> None:
    policy = default_policy()
    pattern = metric_pattern(policy.progress.regex, "val.loss")
    for line, value in [("val.loss: 0.25", "0.25"), ("VAL.LOSS=1e-3", "1e-3"), ("val.loss nan", "nan")]:
        match = pattern.search(line)
        assert match is not None and match.group(1) == value
    assert pattern.search("valxloss: 0.25") is None  # the dot is literal
    # Braces elsewhere in the pattern are regex quantifiers, not format fields.
    assert metric_pattern(r"{metric} (\d{2})", "loss").search("loss 42") is not None


def test_default_regex_catches_spec_examples() -> None:
    pattern = metric_pattern(default_policy().progress.regex, "loss")
    for line in ["loss: 0.123", "loss=0.123", "Loss 0.123", "epoch 3 - loss: 1.5e-2 - acc: 0.9"]:
        assert pattern.search(line) is not None, line


def test_semantic_checks_still_run_beside_type_errors() -> None:
    errors = errors_of(with_("monitor", alpha=-1, interval="soon"))
    assert errors == (
        "monitor.interval: expected a number, got string 'soon'",
        "monitor.alpha: must be > 0, got -1.0",
    )


# --- fuzzing --------------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from(["paper", "default", API_VERSION, "Policy", "off", "max", "robust"]),
)
_keys = st.one_of(
    st.sampled_from(
        ["apiVersion", "kind", "mode", "monitor", "alpha", "weights", "robust", "k", "placement"]
    ),
    st.text(max_size=8),
    st.integers(),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _values, max_size=6) | _values)
def test_from_dict_raises_only_policy_error(data: object) -> None:
    try:
        policy = policy_from_dict(data)
    except PolicyError as e:
        assert e.errors
        assert all(isinstance(x, str) and x for x in e.errors)
    else:
        assert policy_from_dict(policy_to_dict(policy)) == policy


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_parse_raises_only_policy_error(text: str) -> None:
    try:
        parse_policy(HEAD + text)
    except PolicyError as e:
        assert e.errors


@pytest.mark.slow
@settings(max_examples=30, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "alpha": st.floats(0.001, 0.5),
            "interval": st.integers(1, 600),
            "normalize": st.sampled_from(["max", "previous", "none"]),
            "stale_ticks": st.integers(0, 100),
        },
    ),
    st.sampled_from(["default", "paper"]),
)
def test_valid_files_round_trip_through_yaml(monitor: dict[str, object], mode: str) -> None:
    p = policy_from_dict({"apiVersion": API_VERSION, "kind": "Policy", "mode": mode, "monitor": monitor})
    assert parse_policy(policy_to_yaml(p)) == p
    for key, value in monitor.items():
        assert getattr(p.monitor, key) == value


def test_load_yaml_is_the_policy_loader_for_every_file() -> None:
    # YAML 1.2 core schema: off/yes are strings, 1e-9 is a number, 1:30 is not 90.
    assert load_yaml("a: off\nb: yes\nc: 1e-9\nd: 1:30\ne: 0x10\n") == {
        "a": "off",
        "b": "yes",
        "c": 1e-9,
        "d": "1:30",
        "e": 16,
    }
    assert load_yaml('{"json": [1, 2.5, null]}') == {"json": [1, 2.5, None]}
    with pytest.raises(YamlError, match=r"line 2, column 1: .*duplicate key 'a'"):
        load_yaml("a: 1\na: 2\n")
    with pytest.raises(ValueError, match="invalid YAML"):
        load_yaml("a: [1\n")
