"""The registry of priority rules, and the weights a worker's jobs get under the policy's.

Every module of this package that declares ``RULE`` (a ``specon.policy.plugin.Rule``) is a
rule: it is found here, so adding a rule is adding its module. The policy file's
``priority`` section (``rule:`` and its choices, one sub-section per rule with knobs, their
defaults, help and checks), the peer policies (``specon.policy.experiments``) and the
command line's choices are built from ``RULES``. A rule module imports nothing that imports
``specon.config`` (the policy file is built from this registry).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import specon.policy.priority as _package
from specon.model import WEIGHT_DEFAULT, ContainerId
from specon.policy.plugin import Rule, registry
from specon.policy.priority.base import JobProgress

A = TypeVar("A")


def _declared() -> list[Rule[Any]]:
    """The ``RULE`` of every module of the package (its ``__path__``, so a rule may also live
    in a folder added to it)."""
    found: list[Rule[Any]] = []
    for info in pkgutil.iter_modules(_package.__path__, f"{_package.__name__}."):
        if info.ispkg or info.name == __name__:
            continue
        rule = getattr(importlib.import_module(info.name), "RULE", None)
        if isinstance(rule, Rule):
            found.append(rule)
    return found


RULES: Mapping[str, Rule[Any]] = registry(_declared())
NAMES: tuple[str, ...] = tuple(RULES)
# Rules that read Algorithm 1's gain: their agents must classify even under a policy that
# never migrates.
NEEDS_GAIN = frozenset(name for name, rule in RULES.items() if rule.needs_gain)


class Settings(Protocol):
    """The policy's ``priority`` section as the rules read it: ``rule``, and each rule's
    knobs as the attribute of its name (``specon.config.PriorityConfig``)."""

    @property
    def rule(self) -> str: ...


def rule_of(cfg: Settings) -> Rule[Any]:
    """The rule ``cfg`` names (``KeyError`` for one not registered)."""
    return RULES[cfg.rule]


def args_of(cfg: Settings, rule: Rule[A]) -> A:
    """``rule``'s knobs in ``cfg`` (its section of the policy file)."""
    return cast(A, getattr(cfg, rule.name))


def weighs(cfg: Settings) -> bool:
    """Whether ``cfg``'s rule sets CPU weights at all (``none`` leaves the runtime's)."""
    return rule_of(cfg).weights is not None


def weights(jobs: Sequence[JobProgress], cfg: Settings) -> dict[ContainerId, int]:
    """Each job's CPU weight under ``cfg.rule`` (a rule that sets none: every job the
    default weight)."""
    rule = rule_of(cfg)
    if rule.weights is None:
        return {j.id: WEIGHT_DEFAULT for j in jobs}
    return rule.weights(jobs, None if rule.args is None else args_of(cfg, rule))
