"""``specon config``: validate policy files, print the defaults, show a file's effect, print the
reference of every key and setting."""

from __future__ import annotations

import argparse
import sys

from specon.cli.reference import reference_markdown
from specon.config import (
    MODES,
    Policy,
    PolicyError,
    default_policy,
    load_policy,
    parse_policy,
    policy_to_yaml,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "config",
        help="validate policy files, print the defaults, show a file's effective policy",
        description="Work with specon policy files (apiVersion: specon/v1alpha1).",
    )
    actions = parser.add_subparsers(dest="config_action", metavar="ACTION", required=True)

    validate = actions.add_parser(
        "validate",
        help="check policy files; exit 1 if any has an error",
        description="Check each policy file and list every problem found in it. "
        "Prints 'FILE: ok' for a valid file. Exit status 1 if any file has an error.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="policy file ('-' reads standard input)")
    validate.set_defaults(func=_validate)

    defaults = actions.add_parser(
        "defaults",
        help="print a complete policy file with the default values",
        description="Print a complete, documented policy file holding the defaults of a mode. "
        "It validates as is and is a starting point for your own.",
    )
    defaults.add_argument(
        "--mode", choices=MODES, default="default", help="which defaults (default: default)"
    )
    _comments_flag(defaults)
    defaults.set_defaults(func=_defaults)

    show = actions.add_parser(
        "show",
        help="print the effective policy of a file, defaults filled in",
        description="Validate a policy file and print the complete policy it yields, every default "
        "filled in. Values that differ from the default mode are marked.",
    )
    show.add_argument("file", metavar="FILE", help="policy file ('-' reads standard input)")
    _comments_flag(show)
    show.set_defaults(func=_show)

    reference = actions.add_parser(
        "reference",
        help="print the reference of every policy key and daemon setting (Markdown)",
        description="Print docs/reference.md: every key of the policy file and every operational "
        "setting of the daemons, with its default and meaning, generated from the code.",
    )
    reference.set_defaults(func=_reference)


def _comments_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-comments", dest="comments", action="store_false", help="plain YAML without documentation"
    )


def _load(path: str) -> Policy:
    if path == "-":
        return parse_policy(sys.stdin.read(), source="<stdin>")
    return load_policy(path)


def _validate(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        try:
            _load(path)
        except PolicyError as e:
            print(e, file=sys.stderr)
            status = 1
        else:
            print(f"{'<stdin>' if path == '-' else path}: ok")
    return status


def _defaults(args: argparse.Namespace) -> int:
    sys.stdout.write(policy_to_yaml(default_policy(args.mode), comments=args.comments))
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        policy = _load(args.file)
    except PolicyError as e:
        print(e, file=sys.stderr)
        return 1
    sys.stdout.write(policy_to_yaml(policy, comments=args.comments))
    return 0


def _reference(args: argparse.Namespace) -> int:
    sys.stdout.write(reference_markdown())
    return 0
