"""The peer, aws-node-termination-handler (NTH), as a process of its own against a sandbox on the real
control plane: what ``tests/peers`` and the side-by-side benchmarks (``sidebyside.py``) run.

:class:`Nth` is NTH's last release (``tools/cluster/nth/go.mod`` pins it, ``make cluster-bin`` builds it) in
queue-processor mode, run out of cluster against the sandbox's moto endpoint and real API server.

NTH knows only ``rest.InClusterConfig()``: ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and a
token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount/``
(https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/). :class:`Nth` gives it those in a
private mount namespace (``unshare --mount``, a tmpfs over ``/var/run`` in that namespace only), so nothing
on the machine changes. The token is a ServiceAccount's bound to :data:`NTH_CLUSTER_RULES`, the ClusterRole
NTH's Helm chart installs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from queue_processor_sandbox.control_plane import ControlPlaneError, default_bin_dir, free_port
from queue_processor_sandbox.environment import Sandbox
from queue_processor_sandbox.processes import Process

__all__ = ["NTH_CLUSTER_RULES", "Nth", "find_nth", "nth_version"]

#: The rules of the ClusterRole NTH v1.25.6's chart installs (config/helm/aws-node-termination-handler/
#: templates/clusterrole.yaml), written here as facts: nodes get/list/patch/update, pods list/get, evictions,
#: DaemonSets get (``extensions`` and ``apps``); events create/patch when ``emitKubernetesEvents`` is on.
NTH_CLUSTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "update"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": ["extensions"], "resources": ["daemonsets"], "verbs": ["get"]},
    {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
]
NTH_EVENTS_RULE: dict[str, Any] = {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}

#: NTH's ServiceAccount (its chart's default name).
NTH_SERVICE_ACCOUNT = "aws-node-termination-handler"

_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Runs inside the private mount namespace: a tmpfs over /var/run (this namespace only), the ServiceAccount
# files copied in, then NTH in place of the shell (so signals reach it).
_MOUNT_AND_EXEC = f"""set -e
mount -t tmpfs -o size=1m,mode=0755 queue-processor-peer /var/run
mkdir -p {_SERVICE_ACCOUNT_DIR}
cp "$0"/token "$0"/ca.crt "$0"/namespace {_SERVICE_ACCOUNT_DIR}/
exec "$@"
"""


def nth_version() -> str:
    """The NTH release ``tools/cluster/nth/go.mod`` pins (``v1.25.6``); raises ``ControlPlaneError`` when the
    file is missing (an installed package without the source tree)."""
    go_mod = Path(__file__).resolve().parents[1] / "tools" / "cluster" / "nth" / "go.mod"
    try:
        text = go_mod.read_text()
    except OSError as exc:
        raise ControlPlaneError(f"{go_mod} cannot be read: {exc}") from None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[-2] == "github.com/aws/aws-node-termination-handler":
            return words[-1]
    raise ControlPlaneError(f"{go_mod} does not require github.com/aws/aws-node-termination-handler")


def find_nth(bin_dir: Path | None = None) -> Path:
    """The NTH executable ``make cluster-bin`` built: ``node-termination-handler`` in ``bin_dir`` (default
    ``$QP_CLUSTER_BIN``, else the control plane's cache directory). Raises ``ControlPlaneError`` when it is
    missing or when this machine cannot give it a private mount namespace (``unshare``)."""
    if bin_dir is None:
        env = os.environ.get("QP_CLUSTER_BIN")
        bin_dir = Path(env) if env else default_bin_dir()
    path = bin_dir / "node-termination-handler"
    if not os.access(path, os.X_OK):
        raise ControlPlaneError(
            f"{path} is missing: run `make cluster-bin` (needs Go and the Go module proxy)"
        )
    if shutil.which("unshare") is None:
        raise ControlPlaneError("unshare (util-linux) is missing: NTH's ServiceAccount files need it")
    return path


class Nth(Process):
    """NTH in queue-processor mode against ``sandbox`` (which must run on the real control plane), logging
    JSON lines to ``log``.

    Its settings are its Helm chart's defaults for queue-processor mode (``WORKERS=10``, managed-tag check on,
    no heartbeats, no Kubernetes Events) plus the sandbox's queue, region and endpoint; ``extra`` overrides
    any of them with NTH's own names (``WORKERS``, ``HEARTBEAT_INTERVAL``, ``USE_APISERVER_CACHE``…). Raises
    ``ControlPlaneError`` when NTH is not built, ``ValueError`` for an emulated sandbox (NTH's client needs
    a real API server's TLS and ServiceAccount token).
    """

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        from queue_processor_sandbox.real_kube import RealKube

        binary = find_nth()
        if not isinstance(sandbox.kube, RealKube):
            raise ValueError("NTH runs against a sandbox on the real control plane (kubernetes='real')")
        plane = sandbox.kube.plane
        namespace = f"nth-{sandbox.kube.run}"
        rules = list(NTH_CLUSTER_RULES)
        if extra.get("EMIT_KUBERNETES_EVENTS", "false") == "true":
            rules.append(NTH_EVENTS_RULE)
        token = sandbox.kube.service_account_token(
            namespace=namespace, name=NTH_SERVICE_ACCOUNT, cluster_rules=rules
        )
        account = sandbox.workdir / "nth-serviceaccount"
        account.mkdir(parents=True, exist_ok=True)
        (account / "token").write_text(token)
        (account / "namespace").write_text(namespace)
        shutil.copyfile(plane.ca_file, account / "ca.crt")
        metrics_port, probes_port = free_port(), free_port()
        aws = sandbox.env()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(plane.port),
            "ENABLE_SQS_TERMINATION_DRAINING": "true",
            "QUEUE_URL": aws["QUEUE_URL"],
            "AWS_REGION": aws["AWS_REGION"],
            "AWS_ENDPOINT": aws["AWS_ENDPOINT"],
            "AWS_ACCESS_KEY_ID": aws["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": aws["AWS_SECRET_ACCESS_KEY"],
            "AWS_EC2_METADATA_DISABLED": "true",
            "NODE_NAME": "nth-out-of-cluster",
            "POD_NAME": "aws-node-termination-handler",
            "NAMESPACE": namespace,
            "JSON_LOGGING": "true",
            "ENABLE_PROMETHEUS_SERVER": "true",
            "PROMETHEUS_SERVER_PORT": str(metrics_port),
            "ENABLE_PROBES_SERVER": "true",
            "PROBES_SERVER_PORT": str(probes_port),
            "PROBES_SERVER_ENDPOINT": "/healthz",
            "DELETE_LOCAL_DATA": "true",
            "IGNORE_DAEMON_SETS": "true",
            "POD_TERMINATION_GRACE_PERIOD": "-1",
            "NODE_TERMINATION_GRACE_PERIOD": "120",
            "WORKERS": "10",
            **extra,
        }
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:  # a user namespace gives an unprivileged user the right to mount there
            unshare[1:1] = ["--user", "--map-root-user"]
        argv = [*unshare, "--", "sh", "-c", _MOUNT_AND_EXEC, str(account), str(binary)]
        super().__init__(argv, env, log, metrics_port=metrics_port, probes_port=probes_port)
        self.namespace = namespace
        #: The user the API server's audit log names NTH's requests with.
        self.username = f"system:serviceaccount:{namespace}:{NTH_SERVICE_ACCOUNT}"

    def messages(self) -> list[str]:
        """Its log messages (zerolog's ``message`` field), in order."""
        return [str(line.get("message", line.get("event", ""))) for line in self.lines()]
