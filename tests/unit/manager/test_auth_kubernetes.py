"""TokenReviewAuthenticator against a scripted API: every refusal, the cache (TTL, bound,
token expiry, one review for concurrent checks) and that reviews never block the event
loop. The same against the real API server: tests/k8s/test_auth_kubernetes.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import pytest
from specon_manager.auth import Identity
from specon_manager.auth_kubernetes import (
    EXTRA_POD_NAME,
    EXTRA_POD_UID,
    TokenReviewAuthenticator,
    parse_service_account,
)

from specon.runtime.kubernetes.api import KubeApi, KubeError

AUD = "specon-manager"
USER = "system:serviceaccount:specon:specon-agent"


def jwt(sub: str = "x", exp: float | None = None) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    claims: dict[str, Any] = {"sub": sub} if exp is None else {"sub": sub, "exp": exp}
    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2ln"


def review(
    *,
    authenticated: bool = True,
    audiences: list[str] | None = None,
    username: str = USER,
    pod: str | None = "agent-abc",
    uid: str | None = "uid-1",
) -> dict[str, Any]:
    extra = {}
    if pod is not None:
        extra[EXTRA_POD_NAME] = [pod]
    if uid is not None:
        extra[EXTRA_POD_UID] = [uid]
    return {
        "status": {
            "authenticated": authenticated,
            "audiences": [AUD] if audiences is None else audiences,
            "user": {"username": username, "extra": extra},
        }
    }


def agent_pod(*, uid: str = "uid-1", account: str = "specon-agent", node: str | None = "node-1") -> Any:
    spec: dict[str, Any] = {"serviceAccountName": account}
    if node is not None:
        spec["nodeName"] = node
    return {"metadata": {"name": "agent-abc", "namespace": "specon", "uid": uid}, "spec": spec}


class FakeApi(KubeApi):
    """Answers TokenReviews and pod reads from scripts; counts and records the calls."""

    def __init__(self, reviewed: dict[str, Any] | None = None, pod: Any = None, delay: float = 0.0) -> None:
        self.reviewed = review() if reviewed is None else reviewed
        self.pod = agent_pod() if pod is None else pod
        self.delay = delay
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, *, body: object = None, **_: Any) -> Any:
        self.calls.append((method, path, body))
        time.sleep(self.delay)  # a blocking client, as the real one
        if path.endswith("/tokenreviews"):
            if isinstance(self.reviewed, Exception):
                raise self.reviewed
            return self.reviewed
        if isinstance(self.pod, Exception):
            raise self.pod
        return self.pod


def make(api: FakeApi, **kw: Any) -> TokenReviewAuthenticator:
    return TokenReviewAuthenticator(api, audience=AUD, service_account="specon/specon-agent", **kw)


async def test_an_agent_pods_token_speaks_for_its_node_only() -> None:
    api = FakeApi()
    who = await make(api).authenticate(jwt())
    assert who == Identity(name="agent:node-1", worker="node-1")  # type: ignore[arg-type]
    assert who.may_speak_for("node-1") and not who.may_speak_for("node-2")
    (_, _, sent), (method, path, _) = api.calls
    assert sent == {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": jwt(), "audiences": [AUD]},
    }
    assert (method, path) == ("GET", "/api/v1/namespaces/specon/pods/agent-abc")


@pytest.mark.parametrize(
    ("reviewed", "pod"),
    [
        (review(authenticated=False), None),  # expired, wrong audience, not a token at all
        (review(audiences=["https://kubernetes.default.svc"]), None),  # the API's own token
        (review(audiences=[]), None),
        (review(username="system:serviceaccount:specon:default"), None),  # another account
        (review(username="system:serviceaccount:other:specon-agent"), None),  # same name elsewhere
        (review(username="admin"), None),  # a user of the API, not an agent
        (review(pod=None, uid=None), None),  # a legacy Secret token: bound to no pod
        (review(), agent_pod(uid="uid-2")),  # the pod was replaced by a same-named one
        (review(), KubeError(404, "NotFound", "gone")),  # the pod is gone
        (review(), agent_pod(account="default")),  # the pod runs as another account
        (review(), agent_pod(node=None)),  # not on a node yet
    ],
)
async def test_refused(reviewed: dict[str, Any], pod: Any) -> None:
    assert await make(FakeApi(reviewed, pod)).authenticate(jwt()) is None


async def test_what_is_not_a_jwt_costs_no_review() -> None:
    api = FakeApi()
    auth = make(api)
    for token in ("", "short", "a.b", "a.b.c.d", "x" * 20000 + ".a.b", "é.a.b", "a b.c.d"):
        assert await auth.authenticate(token) is None
    assert api.calls == []


async def test_verdicts_are_cached_for_their_ttl_bounded_and_never_past_the_tokens_exp() -> None:
    now = [0.0]
    api = FakeApi()
    auth = make(api, ttl=30.0, max_entries=2, clock=lambda: now[0])
    assert await auth.authenticate(jwt()) is not None
    assert await auth.authenticate(jwt()) is not None and auth.reviews == 1
    now[0] = 31.0
    assert await auth.authenticate(jwt()) is not None and auth.reviews == 2
    # A token expiring in 5 s is not trusted from the cache after 5 s.
    soon = jwt("soon", exp=time.time() + 5)
    await auth.authenticate(soon)
    now[0] += 6.0
    await auth.authenticate(soon)
    assert auth.reviews == 4
    for i in range(5):
        await auth.authenticate(jwt(f"t{i}"))
    assert len(auth._cache) == 2


async def test_refusals_are_cached_briefly_and_api_failures_not_at_all() -> None:
    now = [0.0]
    api = FakeApi(review(authenticated=False))
    auth = make(api, negative_ttl=5.0, clock=lambda: now[0])
    for _ in range(3):
        assert await auth.authenticate(jwt()) is None
    assert auth.reviews == 1
    now[0] = 6.0
    api.reviewed = review()
    assert await auth.authenticate(jwt()) is not None and auth.reviews == 2
    down = FakeApi(KubeError(0, "Unavailable", "connection refused"))  # type: ignore[arg-type]
    auth = make(down)
    assert await auth.authenticate(jwt()) is None
    assert await auth.authenticate(jwt()) is None and auth.reviews == 2  # retried, not cached


@pytest.mark.slow
async def test_concurrent_checks_of_one_token_share_one_review_off_the_event_loop() -> None:
    api = FakeApi(delay=0.3)
    auth = make(api)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    seen: list[int] = []  # the loop's ticks when a blocking call ended, from the call's thread
    real_request = api.request

    def request(method: str, path: str, **kw: Any) -> Any:
        before = ticks
        answer = real_request(method, path, **kw)
        seen.append(ticks - before)
        return answer

    api.request = request  # type: ignore[method-assign]
    task = asyncio.create_task(ticker())
    try:
        results = await asyncio.gather(*(auth.authenticate(jwt()) for _ in range(5)))
    finally:
        task.cancel()
    assert all(r is not None and r.worker == "node-1" for r in results)
    assert auth.reviews == 1
    # The loop kept running through each 0.3 s blocking call (on the loop, it could not tick
    # at all); how often it ticked depends on the machine's load, so only "at all" is asked.
    assert len(seen) == 2 and all(n >= 1 for n in seen)


@pytest.mark.parametrize("bad", ["specon", "/specon-agent", "specon/", "Spec on/x", "a/b/c"])
def test_the_service_account_is_namespace_slash_name(bad: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        TokenReviewAuthenticator(FakeApi(), audience=AUD, service_account=bad)


@pytest.mark.parametrize(
    ("namespace", "ok"),
    [
        ("a" * 63, True),
        ("a-1", True),
        ("0", True),
        ("a" * 64, False),
        ("-a", False),
        ("a-", False),
        ("A", False),
    ],
)
def test_the_namespace_is_a_dns_label(namespace: str, ok: bool) -> None:
    if ok:
        assert parse_service_account(f"{namespace}/specon-agent") == (namespace, "specon-agent")
    else:
        with pytest.raises(ValueError, match="NAMESPACE/NAME"):
            parse_service_account(f"{namespace}/specon-agent")


def test_an_audience_is_required() -> None:
    with pytest.raises(ValueError, match="audience"):
        TokenReviewAuthenticator(FakeApi(), audience="", service_account="specon/specon-agent")
