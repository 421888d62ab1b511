"""Real Kubernetes nodes for tests: one containerd and one kubelet v1.20.2 per node, on this
machine, registered with the test kube-apiserver (``cluster.py``).

INFRA.md's recipe, with its three non-obvious settings: containerd's CRI has
``restrict_oom_score_adj = true`` (the kubelet asks for oom_score_adj -998, and this machine's
bounding set lacks CAP_SYS_RESOURCE); CNI is a private directory holding only the loopback
plugin (the node reports Ready; pods use ``hostNetwork: true``); and each kubelet's
``--cgroup-root`` exists in every v1 hierarchy, nested under this process's memory cgroup.

Images are built offline (no registry): the pause image is the static ``pause`` binary built
beside the kubelet; the training image is ``tests/rootfs.py``'s near-empty root filesystem,
and a pod of it sees the host's ``/usr``, the Python install, the venv and the repo through
read-only ``hostPath`` volumes at the same paths (:func:`on_real_node` adds them), so the
interpreter, torch and specon inside are exactly the host's. Both are ``docker save``
archives imported with ``ctr images import``.

Network rule: the nodes advertise this machine's own non-loopback address (the kubelet refuses
a loopback node IP), so nothing here makes the apiserver call a kubelet (no logs/exec); what a
job writes is read from the shared volume.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client

from tests.integration.listening import IN_USE
from tests.k8s.cluster import (
    BUILD_SCRIPT,
    EXIT_IMPOSSIBLE,
    PORT_ATTEMPTS,
    BuildImpossibleError,
    KubeCluster,
    _Proc,
    cache_dir,
    free_ports,
    present,
)
from tests.k8s.cluster import _die_with_parent as die_with_parent
from tests.rootfs import docker_archive, host_binds, host_rootfs

CGROUP_ROOT = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "k8s.gcr.io/pause:3.2"  # kubelet 1.20's default sandbox image
TRAIN_IMAGE = "local/specon-train:1"
#: The binds' hostPath volumes are named ``host-0``, ``host-1``, ...
HOST_VOLUME = "host-{}"
PYTHON = str(Path(sys.executable).absolute())  # the venv's interpreter: inside the repo bind
CNI_CONF = '{"cniVersion": "0.4.0", "name": "lo-only", "plugins": [{"type": "loopback"}]}\n'
# The kubelet 1.20's fixed log roots. Shared, each kubelet's log GC would delete the other
# node's pod log directories as "orphaned" (then no container of that pod can be created):
# each node's containerd and kubelet run in a mount namespace of their own with these bound
# to the node's directory.
LOG_ROOTS = {"pods": "/var/log/pods", "containers": "/var/log/containers"}
STATE_PREFIX = "specon-nodes-"  # /tmp/specon-nodes-XXXX: one RealNodes' state, sockets, cgroup name
OWNER_FILE = "owner.pid"


class NodeStartError(RuntimeError):
    """A containerd or kubelet did not come up; the message carries the tail of its log."""


class KubeletPortTakenError(NodeStartError):
    """The kubelet exited: its port was taken between the pick and its bind."""


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    pause: Path
    containerd: Path
    ctr: Path


def ensure_node_binaries(*, timeout: float = 3600.0) -> NodeBinaries:
    """``build-apiserver.sh --node`` (cached, idempotent): kubelet + pause from the Debian
    source tree, containerd/runc/CNI plugins from Debian's packages."""
    env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--node"], env=env, timeout=timeout, check=False)
    if done.returncode == EXIT_IMPOSSIBLE:
        raise BuildImpossibleError(
            f"{BUILD_SCRIPT.name} --node cannot build real nodes here (see its output)"
        )
    done.check_returncode()
    containerd, ctr = shutil.which("containerd"), shutil.which("ctr")
    if containerd is None or ctr is None or shutil.which("runc") is None:
        raise RuntimeError("containerd, ctr or runc not on PATH after the build script installed them")
    return NodeBinaries(cache_dir() / "kubelet", cache_dir() / "pause", Path(containerd), Path(ctr))


def build_images(dest: Path, pause: Path) -> list[Path]:
    """The pause image and the training image as ``docker save`` archives (both well under 1 MB:
    everything else is bound from the host)."""
    pause_root = dest / "pause-rootfs"
    pause_root.mkdir(parents=True, exist_ok=True)
    shutil.copy2(pause, pause_root / "pause")
    return [
        docker_archive(pause_root, PAUSE_IMAGE, dest / "pause.tar", entrypoint=["/pause"]),
        docker_archive(host_rootfs(dest / "train-rootfs"), TRAIN_IMAGE, dest / "train.tar"),
    ]


def on_real_node(pod: Mapping[str, Any], *, image: str = TRAIN_IMAGE) -> dict[str, Any]:
    """A pod written for the stand-in (``python`` on PATH, any image) as it runs on a real node:
    the offline image, never pulled, host network, the host binds as read-only ``hostPath``
    volumes at the same paths, and the venv's interpreter for ``python``."""
    made: dict[str, Any] = copy.deepcopy(dict(pod))
    spec = made["spec"]
    spec["hostNetwork"] = True
    binds = host_binds()
    spec["volumes"] = [
        *(spec.get("volumes") or []),
        *({"name": HOST_VOLUME.format(i), "hostPath": {"path": host}} for i, (host, _) in enumerate(binds)),
    ]
    for c in spec["containers"]:
        c["image"] = image
        c["imagePullPolicy"] = "Never"
        # The venv's console scripts (specon-agent) and interpreter first, as in the host's shell.
        path = {"name": "PATH", "value": f"{Path(PYTHON).parent}:/usr/local/bin:/usr/bin:/bin"}
        c["env"] = [*(c.get("env") or []), path]
        if c.get("command") and c["command"][0] == "python":
            c["command"] = [PYTHON, *c["command"][1:]]
        c["volumeMounts"] = [
            *(c.get("volumeMounts") or []),
            *(
                {"name": HOST_VOLUME.format(i), "mountPath": inside, "readOnly": True}
                for i, (_, inside) in enumerate(binds)
            ),
        ]
    return made


def _own_memory_cgroup() -> str:
    """This process's memory cgroup (``/process_api/<id>`` here): node groups nest under it."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return "/"


def _hierarchies() -> list[Path]:
    """Every mounted v1 hierarchy (named ones such as ``systemd`` too) and ``unified``: the
    kubelet checks that its cgroup root exists in each."""
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink())


def _make_cgroup(relative: str) -> None:
    for h in _hierarchies():
        parts = Path(relative.strip("/")).parts
        for depth in range(1, len(parts) + 1):
            group = h.joinpath(*parts[:depth])
            if group.is_dir():
                continue
            group.mkdir()
            if h.name == "cpuset":  # no task may join before both are set
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (group / knob).write_text((group.parent / knob).read_text())


def _remove_cgroup(relative: str) -> None:
    """Remove the tree under ``relative`` in every hierarchy, deepest first (killing what is
    left inside: a container runc did not get to reap)."""
    for h in _hierarchies():
        top = h / relative.strip("/")
        if not top.is_dir():
            continue
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for group in [*groups, top]:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    procs = group / "cgroup.procs"
                    with contextlib.suppress(OSError):
                        for pid in procs.read_text().split():
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.1)


@dataclass
class Node:
    name: str
    dir: Path
    cgroup: str
    containerd: _Proc | None = None
    kubelet: _Proc | None = None

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"


@dataclass
class RealNodes:
    """Nodes ``names`` of ``cluster``, each a containerd + kubelet, for a ``with`` block.

    ``images``: ``docker save`` archives imported into every containerd before its kubelet
    starts (the pause image at least). Start it from a thread that outlives it (the daemons
    die with the thread that started them).
    """

    cluster: KubeCluster
    binaries: NodeBinaries
    images: Sequence[Path]
    names: Sequence[str] = ("node-1", "node-2")
    labels: Mapping[str, str] = field(default_factory=lambda: {"specon.io/test-node": "true"})
    ready_timeout: float = 90.0
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sweep_stale()
        # Short: a unix socket path must stay under 108 bytes.
        self._tmp = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))
        (self._tmp / OWNER_FILE).write_text(str(os.getpid()))
        self._cgroup = f"{_own_memory_cgroup().rstrip('/')}/{self._tmp.name}"
        self._core = client.CoreV1Api(self.cluster.api_client())

    def __enter__(self) -> RealNodes:
        self.start()
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            for name in self.names:
                node = Node(name, self._tmp / name, f"{self._cgroup}/{name}")
                node.dir.mkdir()
                self.nodes[name] = node
                self._start_containerd(node)
            for node in self.nodes.values():
                self.import_images(node, self.images)
                self._start_kubelet(node)
            for node in self.nodes.values():
                for attempt in range(1, PORT_ATTEMPTS + 1):
                    try:
                        self._wait_ready(node)
                        break
                    except KubeletPortTakenError:
                        if attempt == PORT_ATTEMPTS:
                            raise
                        self._start_kubelet(node)  # on ports picked anew
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every kubelet, then each node's containers, containerd, mounts and cgroups;
        delete the Node objects. Idempotent."""
        for node in self.nodes.values():
            if node.kubelet is not None:
                node.kubelet.stop()
        for node in self.nodes.values():
            if node.containerd is not None and node.containerd.popen.poll() is None:
                self._remove_containers(node)
            if node.containerd is not None:
                node.containerd.stop()
        keep = os.environ.get("SPECON_NODE_LOGS")  # a directory to keep the daemons' logs in
        for node in self.nodes.values():
            if keep:
                Path(keep).mkdir(parents=True, exist_ok=True)
                for log in node.dir.glob("*.log"):
                    shutil.copy(log, Path(keep) / f"{node.name}-{log.name}")
            _unmount_under(node.dir)
            with contextlib.suppress(client.ApiException):
                self._core.delete_node(node.name)
        _remove_cgroup(self._cgroup)
        self.nodes.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def lose(self, name: str) -> None:
        """Node ``name`` dies at once: its kubelet, every container on it and its containerd are
        SIGKILLed (what a power cut leaves: nobody tells the API server anything)."""
        node = self.nodes[name]
        if node.kubelet is not None:
            node.kubelet.popen.kill()
            node.kubelet.popen.wait()
        if node.containerd is not None and node.containerd.popen.poll() is None:
            self._remove_containers(node)
            node.containerd.popen.kill()
            node.containerd.popen.wait()
        node.kubelet = node.containerd = None

    def revive(self, name: str) -> None:
        """Node ``name`` comes back (after ``lose``): containerd and a kubelet on its old state."""
        node = self.nodes[name]
        self._start_containerd(node)
        self._start_kubelet(node)
        self._wait_ready(node)

    def drain(self, namespace: str, timeout: float = 30.0) -> None:
        """Delete the namespace's pods gracefully (1 s) and wait for the kubelets to confirm,
        so no container of one test outlives it into the next."""
        with contextlib.suppress(client.ApiException):
            self._core.delete_collection_namespaced_pod(namespace, grace_period_seconds=1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(client.ApiException):
                if not self._core.list_namespaced_pod(namespace).items:
                    return
            time.sleep(0.3)

    def log_tail(self, lines: int = 20) -> str:
        procs = [p for n in self.nodes.values() for p in (n.containerd, n.kubelet) if p is not None]
        return "\n\n".join(f"== {p.name} ==\n{p.tail(lines)}" for p in procs)

    # -- images ----------------------------------------------------------------------------------

    def ctr(self, node: Node, *args: str, timeout: float = 120) -> str:
        argv = [str(self.binaries.ctr), "-a", str(node.socket), "-n", "k8s.io", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise NodeStartError(f"{' '.join(args[:2])} on {node.name}: {done.stderr.strip()}")
        return done.stdout

    def import_images(self, node: Node, archives: Sequence[Path]) -> None:
        for archive in archives:
            self.ctr(node, "images", "import", str(archive))

    def remove_image(self, node: Node, ref: str) -> None:
        """Forget an image (and let containerd drop its content), to measure a fresh import."""
        self.ctr(node, "images", "rm", "--sync", f"docker.io/{ref}" if ref.count("/") == 1 else ref)

    # -- daemons ---------------------------------------------------------------------------------

    def _spawn(self, node: Node, what: str, argv: Sequence[str]) -> _Proc:
        log = node.dir / f"{what}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,  # noqa: PLW1509  (only prctl: async-signal-safe)
            )
        return _Proc(f"{what} {node.name}", popen, log)

    def _start_containerd(self, node: Node) -> None:
        (node.dir / "cni").mkdir(exist_ok=True)  # exists when the node is revived
        (node.dir / "cni" / "10-lo.conflist").write_text(CNI_CONF)
        config = node.dir / "containerd.toml"
        config.write_text(
            f"""version = 2
root = "{node.dir}/root"
state = "{node.dir}/state"
# Snapshotters this machine cannot use, and the shared /opt/containerd: off.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{node.socket}"
[ttrpc]
  address = "{node.dir}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The kubelet asks for oom_score_adj -998; without CAP_SYS_RESOURCE runc fails every sandbox.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{node.dir}/cni"
"""
        )
        binds = []
        for name, root in LOG_ROOTS.items():
            Path(root).mkdir(parents=True, exist_ok=True)  # the mount point, on the host
            (node.dir / "logs" / name).mkdir(parents=True, exist_ok=True)
            binds += [str(node.dir / "logs" / name), root]
        # A private mount namespace (root's propagation is private here: nothing leaks out);
        # the kubelet joins it (_start_kubelet), so both see the node's own log roots and the
        # volumes the kubelet mounts.
        script = 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && shift 4 && exec "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *binds]
        argv += [str(self.binaries.containerd), "--config", str(config)]
        node.containerd = self._spawn(node, "containerd", argv)
        deadline = time.monotonic() + 30
        while (
            not node.socket.exists()
            or subprocess.run(
                [str(self.binaries.ctr), "-a", str(node.socket), "version"], capture_output=True, check=False
            ).returncode
        ):
            if node.containerd.popen.poll() is not None or time.monotonic() > deadline:
                raise NodeStartError(f"containerd of {node.name} did not start:\n{node.containerd.tail()}")
            time.sleep(0.1)

    def _start_kubelet(self, node: Node) -> None:
        _make_cgroup(node.cgroup)
        port, healthz = free_ports(2)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "address": "127.0.0.1",
            "healthzBindAddress": "127.0.0.1",
            "port": port,
            "healthzPort": healthz,
            "readOnlyPort": 0,
            "evictionHard": {},  # this disk and memory are shared: never evict for pressure
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s",
            # A lost node is told by its Lease (specon.runtime.kubernetes.takeover): 10 s, not
            # 40, so a test waits less for it.
            "nodeLeaseDurationSeconds": 10,
            "syncFrequency": "10s",
        }
        conf_file = node.dir / "kubelet.yaml"
        conf_file.write_text(yaml.safe_dump(config))
        kubeconfig = self.cluster.kubeconfig(node.dir / "kubeconfig")
        endpoint = f"unix://{node.socket}"
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        assert node.containerd is not None
        node.kubelet = self._spawn(
            node,
            "kubelet",
            [
                "nsenter",
                f"--mount=/proc/{node.containerd.popen.pid}/ns/mnt",  # containerd's namespace
                "--",
                str(self.binaries.kubelet),
                f"--config={conf_file}",
                f"--kubeconfig={kubeconfig}",
                "--container-runtime=remote",
                f"--container-runtime-endpoint={endpoint}",
                f"--image-service-endpoint={endpoint}",
                f"--root-dir={node.dir / 'kubelet'}",
                f"--cert-dir={node.dir / 'pki'}",
                f"--hostname-override={node.name}",
                f"--cgroup-root={node.cgroup}",
                f"--node-labels={labels}",
                "--v=1",
            ],
        )

    def _wait_ready(self, node: Node) -> None:
        deadline = time.monotonic() + self.ready_timeout
        assert node.kubelet is not None
        while time.monotonic() < deadline:
            if node.kubelet.popen.poll() is not None:
                why = _fatal(node.kubelet)
                if IN_USE in why.lower():  # any process may take a port between pick and bind
                    raise KubeletPortTakenError(f"kubelet of {node.name}: its port was taken:\n{why}")
                raise NodeStartError(f"kubelet of {node.name} exited:\n{why}")
            with contextlib.suppress(client.ApiException):
                status = present(self._core.read_node(node.name).status, "node status")
                if any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
                    # No node lifecycle controller runs: lift the taint admission put on the
                    # new node (as the FakeKubelet does), so the node carries no taint.
                    self._core.patch_node(node.name, {"spec": {"taints": []}})
                    return
            time.sleep(0.5)
        raise NodeStartError(f"{node.name} not Ready after {self.ready_timeout:.0f} s:\n{self.log_tail()}")

    def _remove_containers(self, node: Node) -> None:
        """What the kubelet left running (a test that failed mid-pod): kill and delete."""
        with contextlib.suppress(NodeStartError, subprocess.TimeoutExpired):
            ids = self.ctr(node, "containers", "ls", "-q", timeout=20).split()
            for cid in ids:
                with contextlib.suppress(NodeStartError, subprocess.TimeoutExpired):
                    self.ctr(node, "tasks", "kill", "-s", "SIGKILL", cid, timeout=20)
            deadline = time.monotonic() + 10
            for cid in ids:
                while time.monotonic() < deadline:
                    try:
                        self.ctr(node, "tasks", "rm", "-f", cid, timeout=20)
                        break
                    except NodeStartError as err:
                        if "not found" in str(err):
                            break
                        time.sleep(0.2)
                with contextlib.suppress(NodeStartError, subprocess.TimeoutExpired):
                    self.ctr(node, "containers", "rm", cid, timeout=20)


def sweep_stale() -> None:
    """Remove what a RealNodes whose process died without stopping it left (a SIGKILLed
    pytest): containerd shims keep the containers alive, with their cgroups and mounts."""
    base = Path(tempfile.gettempdir())
    memcg = _own_memory_cgroup().rstrip("/")
    for state in base.glob(f"{STATE_PREFIX}*"):
        try:
            owner = int((state / OWNER_FILE).read_text())
            os.kill(owner, 0)
            continue  # alive: another session's nodes
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            try:
                if time.time() - state.stat().st_mtime < 60:  # being created right now
                    continue
            except FileNotFoundError:
                continue  # its session removed it meanwhile
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError, ProcessLookupError):
                    if str(state).encode() in (proc / "cmdline").read_bytes():
                        os.kill(int(proc.name), signal.SIGKILL)
        # Its cgroup sits under the memory cgroup of the process that made it (maybe not ours).
        made = {f"{memcg}/{state.name}"} | {
            "/" + str(g.relative_to(CGROUP_ROOT / "memory"))
            for g in (CGROUP_ROOT / "memory").glob(f"*/*/{state.name}")
        }
        for group in made:
            _remove_cgroup(group)
        _unmount_under(state)
        shutil.rmtree(state, ignore_errors=True)


def pod_log_files(namespace: str, pod: str) -> list[Path]:
    """The container logs of pod ``namespace/pod`` on any node of a running RealNodes."""
    base = Path(tempfile.gettempdir())
    return sorted(base.glob(f"{STATE_PREFIX}*/*/logs/pods/{namespace}_{pod}_*/*/*.log"))


def _fatal(proc: _Proc) -> str:
    """The lines that say why a Go daemon died (klog's F lines, a panic's first lines), else
    the log's tail: a goroutine dump's tail says nothing."""
    try:
        lines = proc.log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    for i, line in enumerate(lines):
        # klog's F lines: "F1127 05:24:54.218898 ..." (not "Flag --x has been deprecated").
        if re.match(r"F\d{4} ", line) or line.startswith(("panic:", "fatal error:")):
            return "\n".join(lines[max(0, i - 5) : i + 5])
    return proc.tail()


def _unmount_under(root: Path) -> None:
    """Unmount everything under ``root`` (overlay rootfs, shm, sandbox mounts), deepest first."""
    prefix = str(root.resolve()) + "/"
    mounts = [
        line.split()[4].encode().decode("unicode_escape")
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    ]
    for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


@contextlib.contextmanager
def real_nodes(cluster: KubeCluster, binaries: NodeBinaries, workdir: Path) -> Iterator[RealNodes]:
    images = build_images(workdir, binaries.pause)
    with RealNodes(cluster, binaries, images) as nodes:
        yield nodes
