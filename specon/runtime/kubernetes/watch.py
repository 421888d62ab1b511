"""A list+watch cache of one query (client-go's informer, small), fed by a daemon thread.

Built on ``specon.runtime.kubernetes.api``'s blocking client; the failure backoff is tenacity's.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import structlog
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.api import KubeApi, KubeError
from specon.runtime.kubernetes.pods import Manifest

log = structlog.get_logger()

_WATCH_S = 240  # server-side timeout of one watch request; the next resumes where it ended
_BACKOFF_FIRST_S = 0.5  # after a failure; doubling up to _BACKOFF_MAX_S while failures repeat
_BACKOFF_MAX_S = 30.0


class Index(Protocol):
    """Kept in step with an ``Informer``'s cache, under its lock (from its thread)."""

    def reset(self, items: Mapping[tuple[str, str], Manifest]) -> None: ...
    def put(self, key: tuple[str, str], obj: Manifest | None) -> None: ...


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
        index: Index | None = None,
        store: bool = True,
    ) -> None:
        self.api, self.path, self.name = api, path, name
        self.query = dict(query or {})
        self.accept = accept
        self.watch_seconds = watch_seconds
        self.index = index  # told of every change to the cache
        # False: the index is the only store (``items``/``get`` answer nothing): a watch of
        # every pod of a cluster keeps what it needs of each, not the whole manifest.
        self.store = store
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
        # One session is a list, then watches resumed from its version until the server
        # expires it (410) or the thread stops. A failing list is retried after an
        # exponential backoff (tenacity), 0.5 s doubling up to 30 s, cut short by stop(); a
        # watch failing after a good list waits the first backoff and starts a new session,
        # so the backoff resets once a list works.
        while not self._stop.is_set():
            retrying = Retrying(
                retry=retry_if_exception_type(KubeError),
                wait=wait_exponential(multiplier=_BACKOFF_FIRST_S, max=_BACKOFF_MAX_S),
                stop=lambda _state: self._stop.is_set(),
                sleep=self._pause,
                after=self._count_error,
                before_sleep=self._log_error,
                reraise=True,
            )
            try:
                retrying(self._session)
            except KubeError:
                return  # stopped while failing

    def _session(self) -> None:
        if self._stop.is_set():  # stopped during the backoff
            return
        version: str | None = self._relist()
        try:
            while version is not None and not self._stop.is_set():
                version = self._watch(version)
        except KubeError as exc:
            self.errors += 1
            if not self._stop.is_set():
                log.warning("specon.k8s.watch_failed", watch=self.name, error=str(exc))
            self._pause(_BACKOFF_FIRST_S)

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _count_error(self, _state: RetryCallState) -> None:
        self.errors += 1

    def _log_error(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("specon.k8s.watch_failed", watch=self.name, error=str(exc))

    def _relist(self) -> str:
        data = self.api.request("GET", self.path, query=self.query)
        items = {pods.key_of(o): o for o in data.get("items") or [] if isinstance(o, dict) and self.accept(o)}
        with self._lock:
            if self.index is not None:
                self.index.reset(items)
            self._items = items if self.store else {}
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
                    if self.index is not None:
                        self.index.put(key, None)
                else:
                    if self.store:
                        self._items[key] = obj
                    if self.index is not None:
                        self.index.put(key, obj)
            if self._stop.is_set():
                break
        return version
