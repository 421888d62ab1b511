"""Agents on Kubernetes prove who they are with their pod's projected ServiceAccount token.

The agent DaemonSet mounts a ``serviceAccountToken`` projection with the manager's audience
(``manifests/base/agent.yaml``); the kubelet binds that token to the agent's pod and rotates
it. ``TokenReviewAuthenticator`` asks the API server (TokenReview, authentication.k8s.io/v1)
whether a bearer token is valid **for that audience**, accepts only the agent's
ServiceAccount, then reads the pod the token is bound to (``authentication.kubernetes.io/
pod-name`` and ``pod-uid`` in the review's ``user.extra``; the uid must match, so a newer
pod of the same name is not taken for it) and answers the identity of the node that pod is
bound to: ``Identity("agent:<node>", worker=<node>)``. A token speaks for its own node only.

Refused (``None``): a token the API server does not authenticate for the audience (an
expired one, the API's own ServiceAccount tokens, a token minted for anything else), a
token of any other ServiceAccount or user, a token not bound to a pod (a legacy Secret
token), a pod that is gone, replaced, runs under another ServiceAccount or is on no node.

Results are cached for a short TTL (a positive one never past the token's own ``exp``) in
a bounded LRU keyed by the token's SHA-256; concurrent checks of one token share one review;
at most ``max_concurrent`` reviews run at once. The blocking client runs in threads
(``asyncio.to_thread``), never on the event loop. An API server that cannot be reached
authenticates nobody (and nothing is cached), so agents retry at their next heartbeat.

RBAC the manager needs (``manifests/base/rbac.yaml``): ``create`` on ``tokenreviews``
(cluster-scoped) and ``get`` on pods in the agents' namespace.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes import client as k8s_client

from specon.model import WorkerId
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.wire.validate import DNS_LABEL, is_valid_id
from specon_manager.auth import Identity

log = structlog.get_logger()

EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
# A JWT (header.payload.signature, base64url): anything else is refused without a review.
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_MAX_TOKEN_BYTES = 16 * 1024


def parse_service_account(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` as a pair; ``ValueError`` saying what is wrong."""
    namespace, slash, name = text.partition("/")
    if (
        not slash
        or not DNS_LABEL.fullmatch(namespace)
        or not re.fullmatch(r"[a-z0-9][-a-z0-9.]{0,252}", name)
    ):
        raise ValueError(f"expected NAMESPACE/NAME of a ServiceAccount, got {text!r}")
    return namespace, name


class TokenReviewAuthenticator:
    """An ``Authenticator`` (``specon_manager.auth``) for agents' projected ServiceAccount tokens.

    ``api``: a client whose credentials may create TokenReviews and get pods in the agents'
    namespace (the manager's in-cluster ServiceAccount). ``audience``: the audience the
    agents' tokens are minted for (the projection's ``audience``). ``service_account``: the
    agents' ``NAMESPACE/NAME``. ``ttl`` / ``negative_ttl``: seconds a verdict is reused;
    ``max_entries`` bounds the cache; ``max_concurrent`` the reviews in flight.
    """

    def __init__(
        self,
        api: KubeApi | k8s_client.ApiClient,
        *,
        audience: str,
        service_account: str,
        ttl: float = 30.0,
        negative_ttl: float = 5.0,
        max_entries: int = 4096,
        max_concurrent: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not audience:
            raise ValueError("an audience is required: the one the agents' tokens are minted for")
        if ttl < 0 or negative_ttl < 0 or max_entries < 1 or max_concurrent < 1:
            raise ValueError("ttl and negative_ttl must be >= 0, max_entries and max_concurrent >= 1")
        self.api = api if isinstance(api, KubeApi) else KubeApi(api, timeout=10.0)
        self.audience = audience
        self.namespace, self.account = parse_service_account(service_account)
        self.username = f"system:serviceaccount:{self.namespace}:{self.account}"
        self.ttl, self.negative_ttl, self.max_entries = ttl, negative_ttl, max_entries
        self._clock = clock
        self._cache: OrderedDict[bytes, tuple[float, Identity | None]] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[Identity | None]] = {}
        self._slots = asyncio.Semaphore(max_concurrent)
        self.reviews = 0  # TokenReviews sent (for tests and metrics)

    async def authenticate(self, token: str) -> Identity | None:
        if not token or len(token) > _MAX_TOKEN_BYTES or not _JWT.fullmatch(token):
            return None
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        hit = self._cache.get(key)
        if hit is not None:
            if hit[0] > now:
                self._cache.move_to_end(key)
                return hit[1]
            del self._cache[key]
        pending = self._pending.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Identity | None] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            who, cacheable = await self._check(token)
            if cacheable:
                self._remember(key, who, token)
            future.set_result(who)
            return who
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else awaited is not "never retrieved"
            raise
        finally:
            del self._pending[key]

    def _remember(self, key: bytes, who: Identity | None, token: str) -> None:
        ttl = self.negative_ttl if who is None else self.ttl
        if who is not None:
            left = _seconds_left(token)
            if left is not None:
                ttl = min(ttl, left)
        if ttl <= 0:
            return
        self._cache[key] = (self._clock() + ttl, who)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    async def _check(self, token: str) -> tuple[Identity | None, bool]:
        async with self._slots:
            self.reviews += 1
            try:
                return await asyncio.to_thread(self._review, token), True
            except KubeError as exc:  # no verdict: nothing cached, the agent retries
                log.warning("specon.manager.tokenreview_failed", error=str(exc))
                return None, False

    def _refuse(self, reason: str, **fields: Any) -> None:
        log.info("specon.manager.agent_token_refused", reason=reason, **fields)

    def _review(self, token: str) -> Identity | None:
        """One TokenReview and the pod lookup. Blocking; ``KubeError`` when the API server
        gives no verdict (unreachable, 5xx, the manager may not review)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        status = self.api.request("POST", TOKENREVIEWS, body=body).get("status") or {}
        if not status.get("authenticated"):
            self._refuse("not authenticated for the audience", error=str(status.get("error") or "")[:200])
            return None
        if self.audience not in (status.get("audiences") or []):
            self._refuse("audience not granted", audiences=status.get("audiences"))
            return None
        user = status.get("user") or {}
        if user.get("username") != self.username:
            self._refuse("not the agents' ServiceAccount", username=str(user.get("username"))[:200])
            return None
        extra = user.get("extra") or {}
        names, uids = extra.get(EXTRA_POD_NAME) or [], extra.get(EXTRA_POD_UID) or []
        if len(names) != 1 or len(uids) != 1:
            self._refuse("token not bound to a pod", username=self.username)
            return None
        pod_name, pod_uid = str(names[0]), str(uids[0])
        try:
            pod = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{pod_name}")
        except KubeError as exc:
            if exc.status == 404:
                self._refuse("the token's pod is gone", pod=pod_name)
                return None
            raise
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("uid") != pod_uid:
            self._refuse("the token's pod was replaced", pod=pod_name)
            return None
        if (spec.get("serviceAccountName") or spec.get("serviceAccount") or "default") != self.account:
            self._refuse("the pod runs under another ServiceAccount", pod=pod_name)
            return None
        node = spec.get("nodeName")
        if not isinstance(node, str) or not is_valid_id(node):
            self._refuse("the pod is on no node", pod=pod_name)
            return None
        return Identity(name=f"agent:{node}", worker=WorkerId(node))


def _seconds_left(token: str) -> float | None:
    """Seconds until the JWT's ``exp`` (read unverified, only to bound caching)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"]) - time.time()
    except (IndexError, ValueError, KeyError, TypeError):
        return None
