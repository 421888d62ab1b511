"""One registry per kind of pluggable thing: the priority rules and the classifiers. The
policy file's schema, defaults, checks and help, and the command line's choices, are built
from them, so adding a priority rule is adding its module."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import pytest

from specon.config import DOCS, PLUGGABLE, ClassifierName, MonitorConfig, PriorityConfig, PriorityRule
from specon.config.sections import peer_priority
from specon.policy import classifier
from specon.policy.plugin import ClassifierKind, Rule, registry
from specon.policy.priority import rules
from specon.policy.robust_config import RobustConfig

ROOT = Path(__file__).resolve().parents[3]

# A rule nobody ships, in a folder of its own: the only thing written to add it.
THROWAWAY = """
    from __future__ import annotations

    from collections.abc import Sequence
    from dataclasses import dataclass, field

    from specon.model import WEIGHT_MAX, ContainerId
    from specon.policy.plugin import Rule
    from specon.policy.priority.base import JobProgress, ranked_weights


    @dataclass(frozen=True, slots=True)
    class Args:
        spread: float = field(default=3.0, metadata={"doc": "weight of one rank over the next, >= 1"})


    def problems(args: Args) -> list[str]:
        return [] if args.spread >= 1 else [f"spread: must be >= 1, got {args.spread}"]


    def weights(jobs: Sequence[JobProgress], args: Args) -> dict[ContainerId, int]:
        newest_first = sorted(jobs, key=lambda j: -j.started)
        return ranked_weights([j.id for j in newest_first], args.spread)


    RULE = Rule(
        name="lifo",
        summary="newest job first",
        doc="lifo: the most recently started job first (a throwaway rule)",
        args=Args,
        problems=problems,
        weights=weights,
        needs_gain=True,
    )
"""

# Run in a fresh interpreter with the folder on the rule package's path, before anything
# reads the registry.
PROBE = """
    import contextlib, io, json, sys, typing

    import specon.policy.priority as package

    package.__path__.append(sys.argv[1])

    from specon.cli.main import main
    from specon.config import DOCS, PolicyError, PriorityRule, default_policy, parse_policy
    from specon.embedded.live_policies import NAMES, live_policy
    from specon.model import ContainerId
    from specon.policy.priority.base import JobProgress
    from specon.policy.priority.rules import NEEDS_GAIN, weights
    from specon.sim.policies import POLICIES, make_policy


    def output(argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(argv)
        return out.getvalue()


    head = "apiVersion: specon/v1alpha1\\nkind: Policy\\n"


    def errors(text):
        try:
            parse_policy(head + text)
        except PolicyError as e:
            return list(e.errors)
        return []


    chosen = parse_policy(head + "priority: {rule: lifo, lifo: {spread: 10}}\\n")
    jobs = [JobProgress(id=ContainerId(c), started=t) for c, t in (("old", 0.0), ("new", 5.0))]
    sim = make_policy("lifo")
    print(json.dumps({
        "choices": typing.get_args(PriorityRule),
        "default": default_policy().priority.lifo.spread,
        "chosen": [chosen.priority.rule, chosen.priority.lifo.spread],
        "weights": weights(jobs, chosen.priority),
        "docs": [DOCS["priority.rule"], DOCS["priority.lifo"], DOCS["priority.lifo.spread"]],
        "errors": errors("priority: {rule: lifo, lifo: {spread: 0.5, width: 2}}\\n"),
        "needs_gain": "lifo" in NEEDS_GAIN,
        "defaults": output(["config", "defaults"]),
        "sim": [list(POLICIES), output(["sim", "--help"]), sim.manager is None, sim.classify],
        "demo": [list(NAMES), output(["demo", "--help"]), live_policy("lifo").priority.rule],
    }))
"""


@pytest.fixture(scope="module")
def with_a_new_rule(tmp_path_factory: pytest.TempPathFactory) -> dict[str, typing.Any]:
    folder = tmp_path_factory.mktemp("rules")
    (folder / "lifo.py").write_text(textwrap.dedent(THROWAWAY))
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    found: dict[str, typing.Any] = json.loads(run.stdout)
    return found


@pytest.mark.slow
def test_a_new_rule_is_a_choice_with_its_own_section_defaults_and_help(
    with_a_new_rule: dict[str, typing.Any],
) -> None:
    got = with_a_new_rule
    assert got["choices"] == [*rules.NAMES, "lifo"]  # after the shipped ones (default rank)
    assert got["default"] == 3.0
    assert got["chosen"] == ["lifo", 10.0]
    assert got["weights"] == {"new": 10_000, "old": 1_000}
    rule_doc, section_doc, knob_doc = got["docs"]
    assert rule_doc.endswith("; lifo: newest job first")
    assert section_doc == "lifo: the most recently started job first (a throwaway rule)"
    assert knob_doc == "weight of one rank over the next, >= 1"
    defaults = got["defaults"]
    assert "| dl2 | lifo]" in defaults  # the choices of priority.rule
    assert "  # lifo: the most recently started job first (a throwaway rule)\n  lifo:\n" in defaults
    assert "    spread: 3.0  # weight of one rank over the next, >= 1\n" in defaults


def test_a_new_rule_is_checked_and_drives_the_agents_and_the_peer_policies(
    with_a_new_rule: dict[str, typing.Any],
) -> None:
    got = with_a_new_rule
    assert got["errors"] == [
        "priority.lifo.spread: must be >= 1, got 0.5",
        "priority.lifo.width: unknown key (known: spread)",
    ]
    assert got["needs_gain"]
    names, help_text, no_manager, classify = got["sim"]
    assert "lifo" in names and "lifo" in help_text  # specon sim --policy lifo
    assert no_manager and classify  # a peer: no moves, but its rule reads the gain
    names, help_text, rule = got["demo"]
    assert "lifo" in names and "lifo" in help_text and rule == "lifo"  # specon demo --policy lifo


def test_the_shipped_rules_and_classifiers_are_the_choices_in_their_order() -> None:
    assert rules.NAMES == (
        "none",
        "fsp",
        "phased",
        "srpt",
        "optimus",
        "tiresias",
        "hermes",
        "slaq",
        "mbasgd",
        "dl2",
    )
    assert typing.get_args(PriorityRule) == rules.NAMES
    assert {"hermes", "slaq"} == rules.NEEDS_GAIN
    assert classifier.NAMES == ("specon", "robust")
    assert typing.get_args(ClassifierName) == classifier.NAMES
    assert PLUGGABLE == {"monitor": classifier.CLASSIFIERS, "priority": rules.RULES}


def test_each_thing_with_knobs_has_its_section_and_every_knob_its_help() -> None:
    for section, cls in (("monitor", MonitorConfig), ("priority", PriorityConfig)):
        hints = typing.get_type_hints(cls)
        for name, plugin in PLUGGABLE[section].items():
            if plugin.args is None:
                assert name not in hints
                continue
            assert hints[name] is plugin.args
            assert DOCS[f"{section}.{name}"] == plugin.doc != ""
            for f in dataclasses.fields(plugin.args):
                assert DOCS[f"{section}.{name}.{f.name}"] == f.metadata["doc"] != ""
    # The typed view of the robust section (sections.MonitorConfig) is the registry's.
    assert typing.get_type_hints(MonitorConfig)["robust"] is RobustConfig
    robust = classifier.CLASSIFIERS["robust"]
    assert MonitorConfig().robust == classifier.args_of(MonitorConfig(), robust) == RobustConfig()


def test_the_shipped_policy_tunes_fsp_and_the_peers_run_every_rule_at_its_papers_arguments() -> None:
    fsp = rules.RULES["fsp"]
    shipped = rules.args_of(PriorityConfig(), fsp)
    assert shipped == dataclasses.replace(fsp.args(), aging=0.5)
    peer = peer_priority("fsp")
    for rule in rules.RULES.values():
        if rule.args is not None:
            assert rules.args_of(peer, rule) == rule.args()


def test_a_name_declared_twice_is_refused() -> None:
    one = Rule(name="x", summary="a", weights=None)
    with pytest.raises(ValueError, match="more than once: x"):
        registry([one, dataclasses.replace(one, summary="b")])
    kind = ClassifierKind(name="specon", summary="again", tick=classifier.CLASSIFIERS["specon"].tick)
    with pytest.raises(ValueError, match="more than once: specon"):
        registry([*classifier.CLASSIFIERS.values(), kind])


def test_the_agents_leave_the_runtime_weights_alone_only_under_a_rule_that_sets_none() -> None:
    assert [name for name in rules.NAMES if not rules.weighs(PriorityConfig(rule=name))] == ["none"]
