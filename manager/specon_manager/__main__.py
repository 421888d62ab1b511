"""``specon-manager`` / ``python -m specon_manager``: run the specon manager daemon."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog
from aiohttp import web

from specon.config import PolicyError, default_policy, load_policy
from specon.daemon import logs
from specon.daemon.cli_args import (
    check_token_strength,
    load_settings,
    missing_extra,
    read_token,
    split_listen,
)
from specon.daemon.settings import ManagerSettings
from specon_manager.app import create_app
from specon_manager.auth import Authenticator, Chain, StaticTokens, load_agent_tokens
from specon_manager.journal import Journal, JournalStore
from specon_manager.shell import ManagerShell

log = structlog.get_logger()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specon-manager",
        description="The specon manager: collects agent heartbeats, decides migrations (Algorithm 2) and "
        "rebalancing (Algorithm 3), journals them, and serves /v1/status, /, /metrics and /healthz.",
        epilog="Operational settings (ticker period, poll hold, status cache and page sizes) come from "
        "SPECON_MANAGER_* environment variables; see docs/reference.md (specon config reference).",
    )
    p.add_argument(
        "--listen",
        type=split_listen,
        default=("127.0.0.1", 7700),
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:7700)",
    )
    p.add_argument(
        "--policy", type=Path, help="policy YAML (apiVersion specon/v1alpha1); default: SPEC defaults"
    )
    p.add_argument(
        "--agent-tokens",
        type=Path,
        metavar="FILE",
        help="YAML mapping 'worker id: token', one token per agent: a token speaks only for its own "
        "worker (403 otherwise). Recommended; see docs/safety.md, Security model",
    )
    p.add_argument(
        "--agent-auth",
        choices=("tokens", "kubernetes"),
        default="tokens",
        help="how agents prove who they are: tokens = --agent-tokens/--token-file (default); kubernetes = "
        "each agent pod's projected ServiceAccount token, checked by TokenReview and bound to the node "
        "its pod runs on (its worker id)",
    )
    p.add_argument(
        "--agent-auth-audience",
        default="specon-manager",
        help="with --agent-auth kubernetes: the audience the agents' tokens are minted for "
        "(default specon-manager)",
    )
    p.add_argument(
        "--agent-service-account",
        default=f"{os.environ.get('POD_NAMESPACE', 'specon')}/specon-agent",
        metavar="NS/NAME",
        help="with --agent-auth kubernetes: the agents' ServiceAccount (default $POD_NAMESPACE/specon-agent)",
    )
    p.add_argument(
        "--token-file",
        help="file holding a shared bearer token that speaks for every worker (single-tenant setups; "
        "default: $SPECON_TOKEN). At least 32 bytes",
    )
    p.add_argument(
        "--read-token-file",
        help="file holding a read-only token: with it, GET /v1/status and / need this token (or the "
        "shared one); without it they are open",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("specon-state"),
        help="directory for the migration journal (default ./specon-state)",
    )
    p.add_argument(
        "--journal",
        choices=("sqlite", "kubernetes"),
        default="sqlite",
        help="where migrations and marks are journaled: sqlite = <state-dir>/journal.db (default); "
        "kubernetes = ConfigMaps in --journal-namespace, so a manager restarted on any node recovers",
    )
    p.add_argument(
        "--journal-namespace",
        default=os.environ.get("POD_NAMESPACE", "specon"),
        help="namespace of the kubernetes journal (default $POD_NAMESPACE, else specon)",
    )
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig for the kubernetes journal and --agent-auth kubernetes (default: in-cluster)",
    )
    p.add_argument("--dry-run", action="store_true", help="decide and record, but never touch a container")
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default info)")
    p.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log rendering (default json)"
    )
    return p


def _authenticator(args: argparse.Namespace) -> tuple[Authenticator, bool]:
    """Who may call, from the token options; ValueError/OSError saying what is wrong."""
    kube = args.agent_auth == "kubernetes"
    try:
        agents = load_agent_tokens(args.agent_tokens) if args.agent_tokens else None
        wants_shared = args.token_file or not (agents or kube)
        shared = read_token(args.token_file) if wants_shared else ""
        read = read_token(args.read_token_file) if args.read_token_file else ""
    except OSError as exc:
        raise ValueError(f"cannot read the token file: {exc}") from exc
    if shared:
        check_token_strength(shared, what="shared token")
    if args.read_token_file:
        check_token_strength(read, what="read token")
    if not (agents or shared or kube):
        raise ValueError("no token: pass --agent-tokens FILE, --token-file FILE or set SPECON_TOKEN")
    static = StaticTokens(agents=agents, shared=shared or None, read=read or None)
    if not kube:
        return static, bool(read)
    if missing := missing_extra("kubernetes", "kubernetes", "--agent-auth kubernetes"):
        raise ValueError(missing)
    # Imported here only: the client is heavy and only this mode needs it.
    from specon.runtime.kubernetes.backend import load_api_client  # noqa: PLC0415
    from specon_manager.auth_kubernetes import TokenReviewAuthenticator  # noqa: PLC0415

    try:
        review = TokenReviewAuthenticator(
            load_api_client(args.kubeconfig),
            audience=args.agent_auth_audience,
            service_account=args.agent_service_account,
        )
    except ValueError:
        raise
    except Exception as exc:  # the client raises several unrelated types for a bad config
        raise ValueError(f"no Kubernetes configuration for --agent-auth kubernetes: {exc}") from exc
    return Chain(static, review), bool(read)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
    except (PolicyError, OSError) as exc:
        print(f"specon-manager: {exc}", file=sys.stderr)
        return 2
    settings = load_settings(ManagerSettings, "specon-manager")
    if settings is None:
        return 2
    if args.dry_run:
        policy = dataclasses.replace(policy, migration=dataclasses.replace(policy.migration, dry_run=True))
    try:
        auth, guard_reads = _authenticator(args)
    except (OSError, ValueError) as exc:  # missing, unreadable, not text, weak, reused
        print(f"specon-manager: {exc}", file=sys.stderr)
        return 2
    journal: JournalStore
    if args.journal == "kubernetes":
        if missing := missing_extra("kubernetes", "kubernetes", "--journal kubernetes"):
            print(f"specon-manager: {missing}", file=sys.stderr)
            return 2
        # Imported here only: the client is heavy and only this journal needs it.
        from specon.runtime.kubernetes.backend import load_api_client  # noqa: PLC0415
        from specon_manager.k8s_journal import KubeJournal  # noqa: PLC0415

        try:
            # No pod mirror: the manager may not write pods (least privilege; docs/kubernetes.md).
            journal = KubeJournal(load_api_client(args.kubeconfig), args.journal_namespace, mirror_pods=False)
            journal.marks()  # fail fast: the API is reachable and the role allows it
        except Exception as exc:  # JournalError, or what the client raises for a bad config
            print(f"specon-manager: cannot use the kubernetes journal: {exc}", file=sys.stderr)
            return 2
    else:
        try:
            journal = Journal(args.state_dir / "journal.db")
        except (OSError, sqlite3.Error) as exc:  # state dir not creatable, file not a journal
            print(f"specon-manager: cannot open the journal in {args.state_dir}: {exc}", file=sys.stderr)
            return 2
    try:
        shell = ManagerShell(policy=policy, journal=journal)
    except Exception as exc:  # the journal could not be read back (a corrupt file, an API error)
        print(f"specon-manager: cannot read the journal: {exc}", file=sys.stderr)
        journal.close()
        return 2
    app = create_app(shell, auth=auth, guard_reads=guard_reads, settings=settings)
    host, port = args.listen
    log.info(
        "specon.manager.starting",
        host=host,
        port=port,
        mode=policy.mode,
        dry_run=policy.migration.dry_run,
        journal=str(journal.path),
    )
    try:
        web.run_app(
            app,
            host=host,
            port=port,
            print=None,
            handle_signals=True,
            access_log=None,
            shutdown_timeout=settings.shutdown_timeout,
        )
    except OSError as exc:  # e.g. the address is in use
        print(f"specon-manager: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    finally:
        journal.close()
        log.info("specon.manager.stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
