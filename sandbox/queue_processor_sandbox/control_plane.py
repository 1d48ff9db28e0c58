"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
KWOK's fake kubelets, built from the Go module proxy by ``make cluster-bin`` (``tools/cluster/build.sh``).

It is the judge of Kubernetes semantics for the tests and the sandbox (``--kubernetes real``): PodDisruptionBudget
status is computed by the real disruption controller, ReplicaSet and DaemonSet pods are created by their real
controllers and bound by the real scheduler, evictions and patches are answered by the real API server. KWOK
makes the nodes it manages (annotation ``kwok.x-k8s.io/node: fake``) Ready, the pods bound to them Running and
Ready, and finishes a pod's deletion when its grace period ends (at its ``deletionTimestamp``), as a kubelet
whose containers use all of their grace would.

What runs, all on 127.0.0.1 with free ports and one temporary directory (removed by :meth:`ControlPlane.stop`):

- etcd (``--unsafe-no-fsync``: a test cluster, never a durable one);
- kube-apiserver: TLS with a CA generated per start, client certificates, ``--authorization-mode=Node,RBAC``,
  ServiceAccount token signing keys, API Priority and Fairness as shipped, ``NodeRestriction`` admission, and an
  audit log (:attr:`ControlPlane.audit_log`, JSON lines, level Metadata; evictions at level Request) of every
  request except those of the control plane's own components;
- kube-controller-manager with its default controllers (disruption, ReplicaSet, DaemonSet, garbage collector,
  node lifecycle…), no leader election;
- kube-scheduler, no leader election;
- kwok (node leases renewed every ``node_lease_s / 4`` seconds).

Every child gets ``PR_SET_PDEATHSIG`` (SIGKILL), so a test run that is killed does not leave a control plane
behind; :meth:`ControlPlane.stop` (also on ``__exit__``) stops them in reverse order, SIGTERM then SIGKILL.

Where the binaries are: ``$QP_CLUSTER_BIN`` if set, else the directory ``tools/cluster/build.sh`` builds into
(``$QP_CLUSTER_CACHE``, default ``~/.cache/queue-processor/cluster``, then a directory named after the versions
pinned in the wrapper modules' go.mod files). :func:`find_binaries` raises :class:`ControlPlaneError`
with a one-line reason when they are missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from queue_processor_sandbox.cluster import MANUAL_STATUS

__all__ = [
    "COMPONENTS",
    "ControlPlane",
    "ControlPlaneError",
    "find_binaries",
    "pinned_versions",
]

#: The binaries a control plane needs, as ``tools/cluster/build.sh`` names them.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")

#: The wrapper modules (``tools/cluster/<dir>/go.mod``) and the module whose version each pins.
WRAPPERS = {"k8s": "k8s.io/kubernetes", "etcd": "go.etcd.io/etcd/server/v3", "kwok": "sigs.k8s.io/kwok"}

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "cluster"

#: Annotation that makes KWOK manage a node (its default selector).
KWOK_NODE = "kwok.x-k8s.io/node"
#: Annotation (RFC 3339 time) before which KWOK leaves a node not Ready (a node that registers, then turns Ready).
READY_AT = "sandbox.queue-processor.dev/ready-at"


class ControlPlaneError(RuntimeError):
    """The control plane cannot be started here; the message says why in one line (e.g. binaries not built)."""


def pinned_versions(tools: Path = TOOLS) -> dict[str, str]:
    """``{"k8s": "v1.34.4", "etcd": "v3.5.21", "kwok": "v0.7.0"}`` as pinned by the wrapper modules' go.mod files
    (their ``require`` lines). Raises :class:`ControlPlaneError` when a go.mod is missing or pins none."""
    versions = {}
    for directory, module in WRAPPERS.items():
        path = tools / directory / "go.mod"
        try:
            text = path.read_text()
        except OSError as exc:
            raise ControlPlaneError(f"cannot read {path}: {exc.strerror}") from None
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
        if match is None:
            raise ControlPlaneError(f"{path} does not require {module}")
        versions[directory] = match.group(1)
    return versions


def default_bin_dir(tools: Path = TOOLS) -> Path:
    """The directory ``tools/cluster/build.sh`` builds into for the pinned versions (it may not exist)."""
    cache = os.environ.get("QP_CLUSTER_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "queue-processor" / "cluster"
    )
    v = pinned_versions(tools)
    return Path(cache) / f"k8s-{v['k8s']}-etcd-{v['etcd']}-kwok-{v['kwok']}" / "bin"


def find_binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """Component name → executable path. ``bin_dir`` defaults to ``$QP_CLUSTER_BIN``, else
    :func:`default_bin_dir`. Raises :class:`ControlPlaneError` naming the first missing binary and the
    command that builds it."""
    if bin_dir is None:
        env = os.environ.get("QP_CLUSTER_BIN")
        bin_dir = Path(env) if env else default_bin_dir()
    found = {}
    for name in COMPONENTS:
        path = bin_dir / name
        if not os.access(path, os.X_OK):
            hint = "run `make cluster-bin` (needs Go and the Go module proxy)"
            raise ControlPlaneError(f"{path} is missing: {hint}")
        found[name] = path
    return found


#: Times :meth:`ControlPlane.start` starts again on new ports when a port it chose was taken meanwhile.
PORT_ATTEMPTS = 3


#: Random, whatever seed a test gives the ``random`` module (pytest-randomly seeds every worker alike).
_PICK = random.SystemRandom()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``net.ipv4.ip_local_port_range``; 32768 when unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port that was free a moment ago on every address, chosen at random below the kernel's ephemeral
    range: a port of that range may be taken at any moment as the local port of an outgoing connection (the
    bench opens thousands; a controller once failed to start on a port an outgoing connection took), one below
    it only by another listener. A port the kernel picks when there is no room below the range."""
    low = _ephemeral_low()
    if low >= 12000:
        for _ in range(100):
            port = _PICK.randrange(10000, low)
            with socket.socket() as sock:
                try:
                    sock.bind(("0.0.0.0", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------------------- PKI


@dataclass
class _Pki:
    """A CA, the API server's serving certificate, client certificates and the ServiceAccount signing key, as
    PEM files in ``directory``."""

    directory: Path

    def __post_init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        self.directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        until = now + dt.timedelta(days=2)

        def write_key(name: str, key: Any) -> Path:
            path = self.directory / f"{name}.key"
            path.write_bytes(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            path.chmod(0o600)
            return path

        def write_cert(name: str, cert: Any) -> Path:
            path = self.directory / f"{name}.crt"
            path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            return path

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "queue-processor-test-ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.ca_cert = write_cert("ca", ca)
        self.ca_key = write_key("ca", ca_key)

        def issue(
            name: str, common_name: str, groups: list[str], *, server: bool = False
        ) -> tuple[Path, Path]:
            key = ec.generate_private_key(ec.SECP256R1())
            subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
            builder = (
                x509.CertificateBuilder()
                .subject_name(x509.Name(subject))
                .issuer_name(ca_name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now)
                .not_valid_after(until)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(
                    x509.ExtendedKeyUsage(
                        [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                    ),
                    critical=False,
                )
            )
            if server:
                names: list[x509.GeneralName] = [
                    x509.DNSName(n)
                    for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
                ]
                names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.96.0.1")]
                builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
            return write_cert(name, builder.sign(ca_key, hashes.SHA256())), write_key(name, key)

        self.serving = issue("apiserver", "kube-apiserver", [], server=True)
        self.admin = issue("admin", "queue-processor-test-admin", ["system:masters"])
        self.controller_manager = issue(
            "controller-manager", "system:kube-controller-manager", ["system:masters"]
        )
        self.scheduler = issue("scheduler", "system:kube-scheduler", ["system:masters"])
        self.kwok = issue("kwok", "kwok-controller", ["system:masters"])

        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_private = write_key("service-account", sa_key)
        self.sa_public = self.directory / "service-account.pub"
        self.sa_public.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )


def _kubeconfig(path: Path, server: str, ca: Path, user: dict[str, str]) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}],
        "current-context": "real",
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


# ------------------------------------------------------------------------------------------------- processes

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Process:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )

    def check(self) -> None:
        """Raise :class:`ControlPlaneError` with the log's tail when the process has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
            raise ControlPlaneError(
                f"{self.name} exited with status {self.popen.returncode}: {' | '.join(tail)[-600:]}"
            )

    def stop(self, timeout_s: float) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait(5)


_KWOK_CONFIGURATION = """\
# KWOK's own options. It plays pod and node stages with 4 workers by default: in a storm of 2,000 evictions
# the replacements then turned Ready so late that PodDisruptionBudgets held the drains past their notice
# (docs/benchmarks.md). A cluster has one kubelet per node, each acting on its own pods at once.
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 32
  nodePlayStageParallelism: 16
"""

_NODE_STAGES = """\
# Node stages for KWOK (https://kwok.sigs.k8s.io/docs/user/stages-configuration/): our own. A managed node turns
# Ready at the time its ready-at annotation names (at once without it); a Ready node's status is refreshed every
# ten minutes (its Lease, renewed by KWOK, is the heartbeat).
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: qp-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["@READY_AT@"]'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ .metadata.name | Quote }}
        type: Hostname
      allocatable:
        cpu: "1000"
        memory: 1Ti
        pods: "1000"
      capacity:
        cpu: "1000"
        memory: 1Ti
        pods: "1000"
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        bootID: ""
        machineID: ""
        osImage: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: qp-node-heartbeat
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
""".replace("@READY_AT@", READY_AT)

_POD_STAGES = """\
# Pod stages for KWOK (https://kwok.sigs.k8s.io/docs/user/stages-configuration/): our own, written for the
# tests. A pod bound to a managed node turns Running and Ready at once; a pod of a Job completes; a pod being
# deleted is finished (deleted) when its grace period ends, at its deletionTimestamp, as a kubelet would after
# containers that used all of their grace. The API server keeps a deletionTimestamp to the second (truncated), so
# this comes up to 1 s early: a pod with 1 s of grace may go at once. Pods with the manual-status annotation are
# left to the test.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: qp-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
        ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
      conditions:
      {{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
      - type: {{ . }}
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: qp-pod-job-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
  next:
    statusTemplate: |
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: qp-pod-deleted-after-grace
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.deletionTimestamp'
  next:
    delete: true
"""

_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "None",
            "users": [
                "system:kube-controller-manager",
                "system:kube-scheduler",
                "kwok-controller",
                "system:apiserver",
            ],
        },
        {"level": "None", "nonResourceURLs": ["/readyz*", "/healthz*", "/livez*", "/version", "/openapi*"]},
        {"level": "Request", "resources": [{"group": "", "resources": ["pods/eviction"]}]},
        {"level": "Metadata"},
    ],
}


@dataclass
class ControlPlane:
    """The control plane; use as a context manager or call :meth:`start`/:meth:`stop`.

    ``workdir``: where data, certificates, kubeconfigs and logs go (a new temporary directory, removed at stop,
    when ``None``). ``bin_dir``: see :func:`find_binaries`. ``node_lease_s``: the node Lease duration KWOK sets
    (renewed every quarter of it; the node lifecycle controller's grace period is set above it), raise it for
    thousands of nodes. ``client_qps``: the API rate of kube-controller-manager and kube-scheduler (their
    defaults, 20 and 50, would take minutes to create and bind a thousand nodes' pods).

    Raises :class:`ControlPlaneError` from :meth:`start` when a binary is missing or a component does not
    come up within ``start_timeout_s`` seconds.
    """

    workdir: Path | None = None
    bin_dir: Path | None = None
    node_lease_s: int = 40
    client_qps: int = 200
    start_timeout_s: float = 90.0
    binaries: dict[str, Path] = field(default_factory=dict, init=False)
    port: int = field(default=0, init=False)
    _processes: list[_Process] = field(default_factory=list, init=False)
    _owned_dir: bool = field(default=False, init=False)
    _pki: _Pki | None = field(default=None, init=False)

    # ------------------------------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``, the API server."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def directory(self) -> Path:
        """The working directory (raises ``RuntimeError`` before :meth:`start`)."""
        if self.workdir is None:
            raise RuntimeError("the control plane is not started")
        return self.workdir

    @property
    def admin_kubeconfig(self) -> Path:
        """A kubeconfig for a cluster administrator (group ``system:masters``)."""
        return self.directory / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        """The CA certificate the API server's serving certificate is signed by."""
        return self.directory / "pki" / "ca.crt"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines, ``audit.k8s.io/v1`` Events)."""
        return self.directory / "audit.log"

    @property
    def kubectl(self) -> Path:
        """The kubectl built with the control plane."""
        return self.binaries["kubectl"]

    def log(self, component: str) -> Path:
        """The log file of a component (``etcd``, ``kube-apiserver``…)."""
        return self.directory / "logs" / f"{component}.log"

    # ---------------------------------------------------------------------------------------- lifecycle

    def start(self) -> ControlPlane:
        """Start every component and return when the API server is ready and the controllers run. Cleans up
        after itself when it raises."""
        self.binaries = find_binaries(self.bin_dir)
        if self.workdir is None:
            base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # etcd on tmpfs when there is one
            self.workdir = Path(tempfile.mkdtemp(prefix="qp-control-plane-", dir=base))
            self._owned_dir = True
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start()
                return self
            except ControlPlaneError as exc:
                # A port free_port() found free was taken by another process before the component bound it
                # (another test worker's plane, moto, a controller): start again on new ports.
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS - 1:
                    self.stop()
                    raise
                for process in reversed(self._processes):
                    process.stop(10.0)
                self._processes.clear()
                shutil.rmtree(self.directory / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _start(self) -> None:
        d = self.directory
        (d / "logs").mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout_s
        pki = self._pki = _Pki(d / "pki")
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                "--name=qp",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=qp=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait(deadline, "etcd", lambda: _http_ok(f"{etcd_url}/health"))
        policy = d / "audit-policy.json"
        policy.write_text(json.dumps(_AUDIT_POLICY))
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={pki.serving[0]}",
                f"--tls-private-key-file={pki.serving[1]}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_public}",
                f"--service-account-signing-key-file={pki.sa_private}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",  # the kubernetes Service cannot point at 127.0.0.1
                "--profiling=false",
                "--v=1",
            ],
        )
        user = {"client-certificate": str(pki.admin[0]), "client-key": str(pki.admin[1])}
        _kubeconfig(self.admin_kubeconfig, self.url, pki.ca_cert, user)
        self._wait(deadline, "kube-apiserver /readyz", lambda: self._get("/readyz") == 200)

        def component_kubeconfig(name: str, cert: tuple[Path, Path]) -> Path:
            user = {"client-certificate": str(cert[0]), "client-key": str(cert[1])}
            return _kubeconfig(d / f"{name}.kubeconfig", self.url, pki.ca_cert, user)

        kcm = component_kubeconfig("controller-manager", pki.controller_manager)
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={pki.sa_private}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--kube-api-qps={self.client_qps}",
                f"--kube-api-burst={self.client_qps * 2}",
                f"--node-monitor-grace-period={max(50, self.node_lease_s * 3 // 2)}s",
                "--concurrent-replicaset-syncs=10",
                "--concurrent-daemonset-syncs=4",
                "--v=1",
            ],
        )
        scheduler_config = d / "scheduler.yaml"
        scheduler_config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(component_kubeconfig("scheduler", pki.scheduler)),
                        "qps": self.client_qps,
                        "burst": self.client_qps * 2,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn("kube-scheduler", [f"--config={scheduler_config}", "--secure-port=0", "--v=1"])
        stages = d / "kwok-stages.yaml"
        stages.write_text(_KWOK_CONFIGURATION + "---\n" + _NODE_STAGES + "---\n" + _POD_STAGES)
        self._spawn(
            "kwok",
            [
                f"--kubeconfig={component_kubeconfig('kwok', pki.kwok)}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE}=fake",
                f"--disregard-status-with-annotation-selector={MANUAL_STATUS}=manual",
                f"--node-lease-duration-seconds={self.node_lease_s}",
                f"--server-address=127.0.0.1:{free_port()}",
                "--node-ip=10.0.0.1",
            ],
        )
        # The controllers run once the service-account controller has made the default namespace's account.
        self._wait(
            deadline,
            "kube-controller-manager (the default ServiceAccount)",
            lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
        )

    def stop(self) -> None:
        """Stop every component (reverse order; SIGTERM, then SIGKILL after 10 s) and remove the working
        directory when :meth:`start` made it. Idempotent."""
        for process in reversed(self._processes):
            process.stop(10.0)
        self._processes.clear()
        if self._owned_dir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
            self._owned_dir = False

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self) -> None:
        """Raise :class:`ControlPlaneError` when a component has exited (one :meth:`kill` stopped is not
        checked until :meth:`start_again`)."""
        for process in self._processes:
            process.check()

    def pids(self) -> dict[str, int]:
        """Each running component's process ID (``etcd``, ``kube-apiserver``, ``kube-controller-manager``,
        ``kube-scheduler``, ``kwok``): what a benchmark reads the CPU time of."""
        return {process.name: process.popen.pid for process in self._processes if process.popen is not None}

    def kill(self, component: str) -> None:
        """SIGKILL one component (``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``,
        ``kwok``; etcd's data stays): an outage for chaos tests. Raises ``KeyError`` for another name."""
        process = self._component(component)
        if process.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                process.popen.kill()
            process.popen.wait(10)
            process.popen = None

    def start_again(self, component: str) -> None:
        """Start a component :meth:`kill` stopped, with the same arguments, and for kube-apiserver wait until
        ``/readyz`` answers 200 (at most ``start_timeout_s``). Raises ``KeyError`` for an unknown name and
        :class:`ControlPlaneError` when it does not come up."""
        process = self._component(component)
        if process.popen is None:
            process.start()
        if component == "kube-apiserver":
            deadline = time.monotonic() + self.start_timeout_s
            self._wait(deadline, "kube-apiserver /readyz", lambda: self._get("/readyz") == 200)

    def _component(self, name: str) -> _Process:
        for process in self._processes:
            if process.name == name:
                return process
        raise KeyError(f"no component {name!r} in this control plane")

    # ------------------------------------------------------------------------------------------ helpers

    def _spawn(self, name: str, args: list[str]) -> None:
        process = _Process(name, [str(self.binaries[name]), *args], self.log(name))
        process.start()
        self._processes.append(process)

    def _wait(self, deadline: float, what: str, ready: Any) -> None:
        delay = 0.05
        while True:
            self.check()
            with contextlib.suppress(OSError, urllib.error.URLError, ssl.SSLError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{what} not ready after {self.start_timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context that trusts the CA and presents the admin client certificate."""
        assert self._pki is not None
        context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        context.load_cert_chain(str(self._pki.admin[0]), str(self._pki.admin[1]))
        return context

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(
                f"{self.url}{path}", context=self.ssl_context(), timeout=5
            ) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """One API request as the administrator (or with a bearer ``token``); returns the decoded JSON body.
        Raises ``urllib.error.HTTPError`` for an error status."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        context = self.ssl_context()
        if token is not None:
            context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def metrics(self) -> str:
        """The API server's ``/metrics`` (Prometheus text format), read as the administrator."""
        request = urllib.request.Request(f"{self.url}/metrics")
        with urllib.request.urlopen(request, context=self.ssl_context(), timeout=30) as response:
            return str(response.read().decode())

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path, *, expiration_s: int = 86_400
    ) -> Path:
        """Create the ServiceAccount ``namespace/name`` (if missing), request a token for it (TokenRequest API)
        and write a kubeconfig that uses it to ``path``. The account has only the rights RBAC gives it."""
        token = self.service_account_token(namespace, name, expiration_s=expiration_s)
        return _kubeconfig(path, self.url, self.ca_file, {"token": token})

    def service_account_token(self, namespace: str, name: str, *, expiration_s: int = 86_400) -> str:
        """A bearer token (TokenRequest API, valid ``expiration_s`` seconds) for the ServiceAccount
        ``namespace/name``, created with its namespace when missing. Raises ``urllib.error.HTTPError`` when the
        API server refuses the TokenRequest."""
        with contextlib.suppress(urllib.error.HTTPError):
            self.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        with contextlib.suppress(urllib.error.HTTPError):
            self.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
            )
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s},
            },
        )
        return str(answer["status"]["token"])

    def audit_events(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Audit events written since byte ``offset`` of the audit log, and the offset to read from next
        (complete lines only)."""
        try:
            with self.audit_log.open("rb") as log:
                log.seek(offset)
                data = log.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n") + 1
        events = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return events, offset + end


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return int(response.status) == 200


@contextlib.contextmanager
def running(**options: Any) -> Iterator[ControlPlane]:
    """``with running() as plane:`` a started :class:`ControlPlane` (keyword arguments are its fields)."""
    plane = ControlPlane(**options)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def main() -> None:  # pragma: no cover - a developer's tool
    """``python -m queue_processor_sandbox.control_plane``: start a control plane, print the admin kubeconfig's
    path, and keep it running until SIGINT or SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()
    with running() as plane:
        print(f"control plane ready in {time.monotonic() - started:.1f} s", flush=True)
        print(f"export KUBECONFIG={plane.admin_kubeconfig}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(1):
                plane.check()


if __name__ == "__main__":  # pragma: no cover
    main()
