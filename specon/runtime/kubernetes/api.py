"""The Kubernetes API as plain JSON: one blocking REST client (``KubeApi``) over the official
client's configured connection, and ``load_api_client``.

With ``specon.runtime.kubernetes.watch`` (the list+watch cache) the only place that touches the
``kubernetes`` package: requests and responses are the manifests the API server sends, so the
rules in ``specon.runtime.kubernetes.pods`` apply to exactly that, and no field is lost to generated
models.

Why threads and not an asyncio client (kubernetes_asyncio, lightkube, kr8s): the backend makes
few, small calls (a save is a GET, a POST or PUT of the restore record, the eviction, then
polls of the watch cache), each bridged with ``asyncio.to_thread`` in one place
(``KubernetesRuntime._call``); the watches run on two daemon threads per runtime
(``k8s_watch.Informer``) and never touch the event loop. The blocking callers that are not
coroutines - ``KubernetesRuntime.job_spec``, the manager's ConfigMap journal and TokenReview
check - would need an async interface first (``Runtime.job_spec`` is synchronous in the
protocol), the Informer would become a task with its own cancellation, and the tests'
``kmock`` emulator and scripted fakes feed this sync client. A switch is worth it only if the
call rate grows (many nodes per agent) or the thread pool becomes the bottleneck; it would
replace ``KubeApi``/``Informer`` behind the same JSON-in/JSON-out surface.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

MERGE_PATCH = "application/merge-patch+json"  # the Content-Type of a JSON merge patch (RFC 7386)


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status (0: no answer), ``reason`` the
    Status reason (``NotFound``, ``Conflict``, ``TooManyRequests``...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if status else message)
        self.status, self.reason, self.message = status, reason, message


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s_client.ApiClient:
    """In-cluster configuration (the pod's ServiceAccount), else the kubeconfig
    (``--kubeconfig``, ``$KUBECONFIG`` or ``~/.kube/config``)."""
    cfg = k8s_client.Configuration()
    if kubeconfig is None and context is None:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return k8s_client.ApiClient(cfg)
        except k8s_config.ConfigException:
            pass
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context, client_configuration=cfg
    )
    return k8s_client.ApiClient(cfg)


class KubeApi:
    """The REST calls the backend makes, JSON in and out, over the official client's
    configured connection (auth, TLS, proxies). Blocking: call from a thread."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout: float = 30.0) -> None:
        self.client = api
        self.timeout = timeout

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: object,
        content_type: str,
        timeout: float | tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, data, post = self.client.param_serialize(
                method,
                path,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            return self.client.call_api(m, url, hdrs, data, post, _request_timeout=timeout)
        except ApiException as exc:
            raise KubeError(int(exc.status or 0), str(exc.reason or ""), str(exc.body or exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"{method} {path}: {exc}") from exc

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: object = None,
        content_type: str = "application/json",
    ) -> Any:
        resp = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=self.timeout
        )
        try:
            raw = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"{method} {path}: {exc}") from exc
        data = _json(raw)
        if not 200 <= resp.status < 300:
            status = data if isinstance(data, dict) else {}
            raise KubeError(
                resp.status,
                str(status.get("reason") or resp.reason or ""),
                str(status.get("message") or raw[:300].decode(errors="replace")),
            )
        return data

    def watch(
        self, path: str, query: Mapping[str, str], *, seconds: int, on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """The events of one watch request (``watch=true`` is added), ending when the
        server closes it. ``on_open`` receives the response so another thread can close it."""
        q = {**query, "watch": "true", "timeoutSeconds": str(seconds), "allowWatchBookmarks": "true"}
        # The read timeout ends a watch the server never closes (a silent network, an emulator).
        resp = self._send(
            "GET", path, query=q, body=None, content_type="application/json", timeout=(10.0, seconds + 30.0)
        )
        raw = resp.response
        on_open(raw)
        try:
            if not 200 <= resp.status < 300:
                data = _json(resp.read())
                status = data if isinstance(data, dict) else {}
                raise KubeError(resp.status, str(status.get("reason", "")), str(status.get("message", "")))
            for line in _lines(raw):
                event = _json(line)
                if isinstance(event, dict):
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, "Unavailable", f"watch {path}: {exc}") from exc
        finally:
            raw.release_conn()


def _lines(resp: Any) -> Iterator[bytes]:
    """Newline-delimited chunks of a streamed response (one watch event per line)."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        yield buffer


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def pods_path(namespace: str | None) -> str:
    return f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
