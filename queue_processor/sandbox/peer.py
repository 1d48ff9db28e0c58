"""Controllers as processes of their own, pointed at a :class:`~queue_processor.sandbox.environment.Sandbox`:
the peer, aws-node-termination-handler (NTH), and what the chaos cases and the benchmarks share with it.

:class:`Process` is one started process: its log (JSON lines, appended to a file), its Prometheus metrics,
its probes, and a bounded stop. :class:`Nth` is NTH's last release (``tools/cluster/nth/go.mod`` pins it,
``make cluster-bin`` builds it) in queue-processor mode, run out of cluster against the sandbox's moto
endpoint and real API server; :class:`QueueProcessor` is ``queue-processor run``.

NTH knows only ``rest.InClusterConfig()``: ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and a
token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount/``
(https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/). :class:`Nth` gives it those in a
private mount namespace (``unshare --mount``, a tmpfs over ``/var/run`` in that namespace only), so nothing
on the machine changes. The token is a ServiceAccount's bound to :data:`NTH_CLUSTER_RULES`, the ClusterRole
NTH's Helm chart installs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from prometheus_client.parser import text_string_to_metric_families

from queue_processor.sandbox.control_plane import ControlPlaneError, default_bin_dir, free_port
from queue_processor.sandbox.environment import Sandbox

__all__ = [
    "NTH_CLUSTER_RULES",
    "Nth",
    "Process",
    "QueueProcessor",
    "Samples",
    "find_nth",
    "nth_version",
    "parse_metrics",
    "peak_rss_mib",
    "proc_status",
    "scrape",
    "total",
]

#: Prometheus samples by sample name (``foo_total``, ``foo_bucket``, ...): (labels, value) pairs.
Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Samples:
    """The Prometheus text exposition format (https://prometheus.io/docs/instrumenting/exposition_formats/)
    as :data:`Samples`, parsed by ``prometheus_client``'s parser. Raises ``ValueError`` on a malformed line."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


def scrape(port: int, *, timeout_s: float = 5.0) -> Samples:
    """``GET http://127.0.0.1:<port>/metrics`` as :data:`Samples`. Raises ``OSError`` (an HTTP error
    included) when it does not answer within ``timeout_s`` seconds or answers other than 200."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        return parse_metrics(response.read().decode())


def proc_status(pid: int) -> dict[str, int]:
    """The numeric fields of ``/proc/<pid>/status`` (proc(5)): ``VmRSS``, ``VmHWM`` (KiB), ``Threads``...;
    empty when the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines:
        key, _, value = line.partition(":")
        words = value.split()
        if words and words[0].isdigit():
            fields[key] = int(words[0])
    return fields


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident memory (``VmHWM``) in MiB, one decimal; 0.0 when it is gone."""
    return round(proc_status(pid).get("VmHWM", 0) / 1024, 1)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there are none)."""
    wanted = labels.items()
    return sum(value for have, value in samples.get(name, []) if wanted <= have.items())


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
    go_mod = Path(__file__).resolve().parents[2] / "tools" / "cluster" / "nth" / "go.mod"
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


class Process:
    """A started controller process whose output (stdout and stderr) is appended to ``log``, with a metrics
    port and a probes port. :meth:`lines` parses the log as JSON lines (any other line becomes
    ``{"event": line}``)."""

    #: The Kubernetes user it acts as on the real control plane (``system:serviceaccount:<ns>:<name>``).
    username: str = ""

    def __init__(
        self, argv: list[str], env: dict[str, str], log: Path, *, metrics_port: int, probes_port: int
    ) -> None:
        self.metrics_port, self.probes_port = metrics_port, probes_port
        self.log_path = log
        self._offset = log.stat().st_size if log.exists() else 0
        self.log: IO[str] = log.open("a")
        self.process = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        """This process's log lines (JSON objects; any other line as ``{"event": line}``)."""
        with self.log_path.open(errors="replace") as text:
            text.seek(self._offset)
            out = []
            for line in text:
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = {"event": line.rstrip("\n")}
                out.append(parsed if isinstance(parsed, dict) else {"event": line})
            return out

    def get(self, path: str, port: int | None = None) -> tuple[int, str]:
        """GET ``path`` from its probes server (or ``port``): (status, body); (0, error) when unreachable."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port or self.probes_port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()
        except OSError as error:
            return 0, str(error)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels``, from its /metrics (0 while the
        server is not up yet)."""
        status, body = self.get("/metrics", self.metrics_port)
        if status == 0:
            return 0.0
        if status != 200:
            raise AssertionError(f"/metrics answered {status}: {body[:200]}")
        return total(parse_metrics(body), name, **labels)

    def stop(self, signum: int, bound_s: float) -> int:
        """Send ``signum`` and wait for the exit; its status. Raises ``AssertionError`` (after a SIGKILL) when
        the process outlives ``bound_s`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the process did not exit within {bound_s} s of signal {signum}") from None
        finally:
            self.log.close()


class QueueProcessor(Process):
    """``queue-processor run`` (the console script beside this interpreter) against ``sandbox``: the sandbox's
    env file settings, JSON logs, metrics and probes on free ports; ``extra`` adds or overrides settings."""

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        metrics_port, probes_port = free_port(), free_port()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            **sandbox.env(),
            "ENABLE_PROMETHEUS_SERVER": "true",
            "PROMETHEUS_SERVER_PORT": str(metrics_port),
            "PROBES_SERVER_PORT": str(probes_port),
            "JSON_LOGGING": "true",
            **extra,
        }
        self.username = sandbox.controller_username
        script = str(Path(sys.executable).parent / "queue-processor")
        super().__init__([script, "run"], env, log, metrics_port=metrics_port, probes_port=probes_port)


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
        from queue_processor.sandbox.real_kube import RealKube

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
