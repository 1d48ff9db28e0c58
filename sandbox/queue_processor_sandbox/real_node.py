"""A real node beside the KWOK ones: a kubelet of the control plane's release (``make cluster-bin``) on a
containerd of its own (Debian's, with runc and the CNI plugins), registered with the real control plane, so
that a pod really runs: the controller's image, installed by Helm, started, probed, sent SIGTERM and
restarted by a kubelet.

Every packet stays on this host. The node's pods get network namespaces on a bridge of the node's own
(``10.244.<n>.0/24``, the CNI ``bridge`` plugin); the host translates the addresses :attr:`RealNode.forwards`
names (a virtual IP and port) to its loopback, where the API server and the sandbox's AWS listen: for the
``kubernetes`` Service's ClusterIP (10.96.0.1:443, in the API server's certificate) that is the one thing
kube-proxy would do here, so a pod's in-cluster configuration works unchanged. (iptables DNAT in ``nat``
PREROUTING with ``route_localnet`` on the bridge: https://www.kernel.org/doc/Documentation/networking/ip-sysctl.txt.)

What these machines need, found here: containerd's CRI must not lower ``oom_score_adj`` (the session runs
without CAP_SYS_RESOURCE, so runc fails to start the pod sandbox at -998: ``restrict_oom_score_adj``); the
kubelet must accept cgroup v1 (``failCgroupV1: false``) and swap (``failSwapOn: false``), on the cgroupfs
driver. :func:`find_node_tools` names what is missing (:class:`RealNodeError`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from queue_processor_sandbox.control_plane import ControlPlane, _Process, default_bin_dir, free_port

__all__ = ["API_SERVICE", "RealNode", "RealNodeError", "find_node_tools"]

#: The ``kubernetes`` Service's ClusterIP and port (the control plane's service range is 10.96.0.0/16).
API_SERVICE = ("10.96.0.1", 443)
#: Debian's binaries and CNI plugins the node runs on (docker.io brings containerd and runc;
#: containernetworking-plugins the plugins): ``tools/image/daemon.sh start`` installs them.
HOST_TOOLS = ("containerd", "ctr", "runc", "iptables", "ip", "docker")
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


class RealNodeError(RuntimeError):
    """What the real node lacks or where it failed, in one line."""


def find_node_tools(bin_dir: Path | None = None) -> dict[str, Path]:
    """Name → path of what the node needs: the kubelet and pause binaries ``make cluster-bin`` builds
    (``bin_dir``, default as the control plane's), and Debian's containerd, runc, CNI plugins, iptables,
    iproute2 and Docker (whose images it imports). Raises :class:`RealNodeError` naming the first missing."""
    bin_dir = bin_dir or Path(os.environ.get("QP_CLUSTER_BIN") or default_bin_dir())
    found: dict[str, Path] = {}
    for name in ("kubelet", "pause"):
        if not os.access(bin_dir / name, os.X_OK):
            raise RealNodeError(f"{bin_dir / name} is missing: run `make cluster-bin`")
        found[name] = bin_dir / name
    for name in HOST_TOOLS:
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if path is None:
            raise RealNodeError(f"{name} not found: tools/image/daemon.sh start installs Debian's packages")
        found[name] = Path(path)
    for plugin in CNI_PLUGINS:
        if not os.access(CNI_BIN / plugin, os.X_OK):
            raise RealNodeError(f"{CNI_BIN / plugin} missing: install Debian's containernetworking-plugins")
    if os.geteuid() != 0:
        raise RealNodeError("a kubelet needs root")
    return found


class RealNode:
    """Node ``name`` of ``plane``, run by a kubelet on this host. ``provider_id`` (``aws:///<az>/<id>``)
    names a sandbox instance; ``labels`` are registered with it; ``images`` (Docker tags) are imported into
    its containerd, so a pod with ``imagePullPolicy: Never`` runs them; ``forwards`` maps (virtual IP, port)
    to a loopback port (the API server's ClusterIP is always forwarded to the plane's port). Files (logs,
    the kubelet's root, containerd's state) go under ``workdir``. Use as a context manager, or call
    :meth:`start` and :meth:`stop`. Raises :class:`RealNodeError` when a tool is missing or the node does not
    turn Ready within ``ready_timeout_s`` seconds."""

    def __init__(
        self,
        plane: ControlPlane,
        name: str,
        workdir: Path,
        *,
        provider_id: str = "",
        labels: dict[str, str] | None = None,
        images: tuple[str, ...] = (),
        forwards: dict[tuple[str, int], int] | None = None,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.plane, self.name, self.workdir = plane, name, workdir
        self.provider_id, self.labels, self.images = provider_id, dict(labels or {}), images
        self.forwards = {API_SERVICE: int(plane.url.rsplit(":", 1)[1]), **(forwards or {})}
        self.ready_timeout_s = ready_timeout_s
        self.tools = find_node_tools()
        free = [n for n in range(1, 250) if not Path(f"/sys/class/net/qpnode{n}").exists()]
        self.subnet = random.SystemRandom().choice(free)  # another node's bridge keeps its subnet
        self.bridge, self.network = f"qpnode{self.subnet}", f"qp-node-{self.subnet}"
        # A unix socket's path has at most 104 bytes here: containerd's and the kubelet's (in its root) go in a
        # short directory of their own.
        self.run_dir = Path(
            tempfile.mkdtemp(prefix="qp-node-", dir="/run" if os.access("/run", os.W_OK) else None)
        )
        self.socket = self.run_dir / "containerd.sock"
        self._containerd = _Process("containerd", [], workdir / "containerd.log")
        self._kubelet = _Process("kubelet", [], workdir / "kubelet.log")
        self._rules: list[list[str]] = []  # nat PREROUTING
        self._refusals: list[list[str]] = []  # filter INPUT

    @property
    def gateway(self) -> str:
        """The host's address on the node's bridge (what its pods route through)."""
        return f"10.244.{self.subnet}.1"

    @property
    def pod_logs(self) -> Path:
        """Where the kubelet writes its pods' container logs (``<namespace>_<pod>_<uid>/<container>/N.log``)."""
        return self.workdir / "pod-logs"

    def __enter__(self) -> RealNode:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """containerd, the images, the bridge and its forwards, the kubelet; returns once the node is Ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start_containerd()
        self._import_images()
        self._network()
        self._start_kubelet()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._ready():
            self._kubelet.check()
            if time.monotonic() > deadline:
                raise RealNodeError(
                    f"node {self.name} not Ready in {self.ready_timeout_s} s: see {self._kubelet.log}"
                )
            time.sleep(0.5)

    def _start_containerd(self) -> None:
        root = self.workdir / "containerd"
        config = root / "config.toml"
        root.mkdir(parents=True, exist_ok=True)
        (root / "cni").mkdir(exist_ok=True)
        config.write_text(
            "\n".join(
                [
                    "version = 2",
                    f'root = "{root / "root"}"',
                    f'state = "{self.run_dir / "state"}"',
                    "[grpc]",
                    f'  address = "{self.socket}"',
                    '[plugins."io.containerd.grpc.v1.cri"]',
                    f'  sandbox_image = "{self._pause_tag}"',
                    "  restrict_oom_score_adj = true",
                    '  [plugins."io.containerd.grpc.v1.cri".cni]',
                    f'    bin_dir = "{CNI_BIN}"',
                    f'    conf_dir = "{root / "cni"}"',
                    '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
                    '    runtime_type = "io.containerd.runc.v2"',
                    "",
                ]
            )
        )
        (root / "cni" / "10-qp.conflist").write_text(json.dumps(self._cni()))
        self._containerd.argv = [str(self.tools["containerd"]), "--config", str(config)]
        self._containerd.start()
        deadline = time.monotonic() + 60
        while self._ctr("version", check=False).returncode != 0:
            self._containerd.check()
            if time.monotonic() > deadline:
                raise RealNodeError(f"containerd did not answer in 60 s: see {self._containerd.log}")
            time.sleep(0.2)

    def _cni(self) -> dict[str, Any]:
        """A bridge with this node's subnet, the host the pods' default gateway, and host ports."""
        ipam = {"type": "host-local", "ranges": [[{"subnet": f"10.244.{self.subnet}.0/24"}]]}
        bridge = {
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": True,
            "isDefaultGateway": True,
            "ipMasq": False,
            "ipam": ipam,
        }
        return {
            "cniVersion": "0.4.0",
            "name": self.network,
            "plugins": [bridge, {"type": "portmap", "capabilities": {"portMappings": True}}],
        }

    @property
    def _pause_tag(self) -> str:
        return "queue-processor.test/pause:1"

    def _import_images(self) -> None:
        """The pause image (made from the pause binary) and ``images`` from Docker into containerd."""
        layer = io.BytesIO()
        with tarfile.open(fileobj=layer, mode="w") as tar:
            tar.add(self.tools["pause"], arcname="pause")
        subprocess.run(
            ["docker", "import", "--change", 'ENTRYPOINT ["/pause"]', "-", self._pause_tag],
            input=layer.getvalue(),
            capture_output=True,
            check=True,
            timeout=120,
        )
        saved = subprocess.Popen(["docker", "save", self._pause_tag, *self.images], stdout=subprocess.PIPE)
        self._ctr("images", "import", "-", stdin=saved.stdout, timeout_s=600)
        if saved.wait(timeout=60) != 0:
            raise RealNodeError(f"docker save {' '.join(self.images)} failed ({saved.returncode})")

    def _ctr(
        self, *args: str, check: bool = True, stdin: Any = None, timeout_s: float = 60
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [str(self.tools["ctr"]), "-a", str(self.socket), "-n", "k8s.io", *args],
            stdin=stdin,
            capture_output=True,
            check=False,
            timeout=timeout_s,
        )
        if check and done.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)}: {done.stderr.decode(errors='replace').strip()}")
        return done

    def pid_of(self, container_id: str) -> int:
        """The host process ID of a running container (``containerd://<id>`` as a pod's status gives it, or the
        bare ID). Raises :class:`RealNodeError` when it is not running."""
        wanted = container_id.rsplit("/", 1)[-1]
        for row in self._ctr("tasks", "ls").stdout.decode().splitlines()[1:]:
            task, pid, state = row.split()[:3]
            if task == wanted and state == "RUNNING":
                return int(pid)
        raise RealNodeError(f"container {wanted} is not running on {self.name}")

    def _network(self) -> None:
        """The bridge, up with the gateway address before the first pod (the plugin then finds it), loopback
        routing allowed on it, and one DNAT rule per forward."""
        run = self._run
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/route_localnet").write_text("1")
        for (address, port), local in self.forwards.items():
            rule = ["PREROUTING", "-i", self.bridge, "-d", address, "-p", "tcp", "--dport", str(port)]
            rule += ["-j", "DNAT", "--to-destination", f"127.0.0.1:{local}"]
            run("iptables", "-t", "nat", "-A", *rule)
            self._rules.append(rule)

    def refuse(self, service: tuple[str, int], refused: bool = True) -> None:
        """Make the service a forward names (virtual IP and port) refuse the node's pods, connections open
        included (a TCP reset for every packet to it, in the filter table's INPUT chain), or answer again
        (``refused=False``): an outage, without a packet leaving this host. Raises :class:`RealNodeError`."""
        local = self.forwards.get(service)
        if local is None:
            raise RealNodeError(f"no forward of {service[0]}:{service[1]} on {self.name}")
        rule = ["INPUT", "-i", self.bridge, "-p", "tcp", "-d", "127.0.0.1", "--dport", str(local)]
        rule += ["-j", "REJECT", "--reject-with", "tcp-reset"]
        if refused and rule not in self._refusals:
            self._run("iptables", "-I", *rule)
            self._refusals.append(rule)
        elif not refused and rule in self._refusals:
            self._run("iptables", "-D", *rule)
            self._refusals.remove(rule)

    @staticmethod
    def _run(*argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        if done.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    def _start_kubelet(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "failCgroupV1": False,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            # A cgroup root of its own: a kubelet removes the pod cgroups under its root it does not know.
            "cgroupRoot": f"/{self.network}",
            "providerID": self.provider_id,
            "podLogsDir": str(self.pod_logs),
            # This host's disk and memory are shared with the rest of the suite: evict only when nearly out.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": "/etc/resolv.conf",
            "syncFrequency": "10s",  # pods' projected volumes (tokens) are written again this often
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        labels = ",".join(f"{key}={value}" for key, value in self.labels.items())
        self._kubelet.argv = [
            *(
                str(self.tools["kubelet"]),
                "--config",
                str(path),
                "--kubeconfig",
                str(self.plane.admin_kubeconfig),
            ),
            *("--root-dir", str(self.run_dir / "kubelet"), "--hostname-override", self.name),
            *(["--node-labels", labels] if labels else []),
        ]
        self._cgroups(create=True)
        self._kubelet.start()

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again, as an upgrade of it does; its pods' containers run on. Its tokens
        were kept in memory only: each pod's projected ServiceAccount token is requested anew and written into
        the pod's volume at its next sync (``syncFrequency``, 10 s here). Raises ``ControlPlaneError`` when the
        new kubelet exits."""
        self._kubelet.stop(30)
        self._kubelet.start()
        time.sleep(1.0)
        self._kubelet.check()

    def _cgroups(self, *, create: bool) -> None:
        """Create the node's cgroup root in every cgroup v1 hierarchy (a new cpuset gets its parent's CPUs and
        memory nodes, as a cpuset must have some before a task joins), or remove it, children first, there
        and in the unified hierarchy (where runc also makes the pods' cgroups)."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            root = hierarchy / self.network
            if (create and hierarchy.name == "unified") or not (hierarchy / "cgroup.procs").exists():
                continue
            if create:
                root.mkdir(exist_ok=True)
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if (hierarchy / name).exists():
                        (root / name).write_text((hierarchy / name).read_text())
                continue
            for directory in sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()

    def _ready(self) -> bool:
        try:
            node = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        except OSError:
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def stop(self) -> None:
        """Stop the kubelet, every container it started, containerd; take the bridge, its rules and the
        mounts under ``workdir`` down; delete the Node. Never raises for what is already gone."""
        self._kubelet.stop(30)
        with contextlib.suppress(RealNodeError, subprocess.TimeoutExpired):
            for task in self._ctr("tasks", "ls", "-q", check=False).stdout.decode().split():
                self._ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        self._containerd.stop(30)
        # The runc shims outlive containerd: theirs name its socket.
        subprocess.run(["pkill", "-KILL", "-f", "--", f"-address {self.socket}"], check=False, timeout=30)
        for rule in self._rules:
            subprocess.run(
                ["iptables", "-t", "nat", "-D", *rule], capture_output=True, check=False, timeout=60
            )
        self._rules.clear()
        for rule in self._refusals:
            subprocess.run(["iptables", "-D", *rule], capture_output=True, check=False, timeout=60)
        self._refusals.clear()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False, timeout=60)
        shutil.rmtree(f"/var/lib/cni/networks/{self.network}", ignore_errors=True)
        for mount in reversed(_mounts_under(self.workdir) + _mounts_under(self.run_dir)):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False, timeout=60)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self._cgroups(create=False)
        with contextlib.suppress(Exception):
            self.plane.request("DELETE", f"/api/v1/nodes/{self.name}")


def _mounts_under(directory: Path) -> list[str]:
    """The mount points under ``directory`` (the kubelet's volumes, containerd's root filesystems), in the
    order they were mounted (proc(5) ``/proc/self/mounts``)."""
    prefix = str(directory.resolve()) + "/"
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [point for point in points if point.startswith(prefix)]
