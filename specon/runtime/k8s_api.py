"""The Kubernetes API as plain JSON: one blocking client (``KubeApi``) over the official
client's configured connection, and a list+watch cache (``Informer``).

The only place (with ``load_api_client``) that touches the ``kubernetes`` package: requests
and responses are the manifests the API server sends, so the rules in
``specon.runtime.k8s_pods`` apply to exactly that, and no field is lost to generated models.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import structlog
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from specon.runtime import k8s_pods as pods
from specon.runtime.k8s_pods import Manifest

log = structlog.get_logger()

_WATCH_S = 240  # server-side timeout of one watch request; the next resumes where it ended


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


class Informer:
    """A list+watch cache of one query, fed by a daemon thread (client-go's informer, small).

    ``accept`` filters what the server sends (it also re-applies the selectors, for servers
    that ignore them). A watch that ends is resumed from the last resourceVersion; ``410
    Gone`` (the version is too old) or any error relists, with backoff on errors.
    """

    def __init__(
        self,
        api: KubeApi,
        path: str,
        *,
        name: str,
        query: Mapping[str, str] | None = None,
        accept: Callable[[Manifest], bool] = lambda _o: True,
        watch_seconds: int = _WATCH_S,
    ) -> None:
        self.api, self.path, self.name = api, path, name
        self.query = dict(query or {})
        self.accept = accept
        self.watch_seconds = watch_seconds
        self._items: dict[tuple[str, str], Manifest] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None
        self.relists = 0
        self.errors = 0

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"specon-watch-{self.name}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()  # unblocks the watch thread's read

    def items(self) -> list[Manifest]:
        with self._lock:
            return list(self._items.values())

    def get(self, namespace: str, name: str) -> Manifest | None:
        with self._lock:
            return self._items.get((namespace, name))

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version: str | None = self._relist()
                backoff = 0.5
                while version is not None and not self._stop.is_set():
                    version = self._watch(version)
            except KubeError as exc:
                self.errors += 1
                if not self._stop.is_set():
                    log.warning("specon.k8s.watch_failed", watch=self.name, error=str(exc))
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def _relist(self) -> str:
        data = self.api.request("GET", self.path, query=self.query)
        items = {pods.key_of(o): o for o in data.get("items") or [] if isinstance(o, dict) and self.accept(o)}
        with self._lock:
            self._items = items
        self.relists += 1
        self._synced.set()
        return str(pods.meta(data).get("resourceVersion") or "")

    def _watch(self, version: str) -> str | None:
        """Apply one watch request's events; the version to resume from, None to relist."""
        query = {**self.query, "resourceVersion": version} if version else self.query

        def opened(resp: Any) -> None:
            self._resp = resp

        for event in self.api.watch(self.path, query, seconds=self.watch_seconds, on_open=opened):
            kind, obj = event.get("type"), event.get("object")
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                if obj.get("code") == 410:
                    log.info("specon.k8s.watch_expired", watch=self.name)
                    return None
                raise KubeError(
                    int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message"))
                )
            version = str(pods.meta(obj).get("resourceVersion") or version or "")
            if kind == "BOOKMARK":
                continue
            key = pods.key_of(obj)
            with self._lock:
                if kind == "DELETED" or not self.accept(obj):
                    self._items.pop(key, None)
                else:
                    self._items[key] = obj
            if self._stop.is_set():
                break
        return version
