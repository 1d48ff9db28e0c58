"""Controllers as processes of their own, pointed at a :class:`~queue_processor_sandbox.environment.Sandbox`:
what the storyline explorer, the chaos cases and the benchmarks share.

:class:`Process` is one started process: its log (JSON lines, appended to a file), its Prometheus metrics,
its probes, and a bounded stop. :class:`QueueProcessor` is ``queue-processor run``. The peer,
aws-node-termination-handler, is run by ``benchmarks/nth.py`` (a process of this kind too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

from prometheus_client.parser import text_string_to_metric_families

from queue_processor_sandbox.environment import Sandbox

__all__ = [
    "Process",
    "QueueProcessor",
    "Samples",
    "listening_ports",
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


def scrape(port: int, *, timeout_s: float = 5.0, names: Collection[str] = ()) -> Samples:
    """``GET http://127.0.0.1:<port>/metrics`` as :data:`Samples`; with ``names`` (metric family names,
    ``queue_processor_messages_received`` for its ``_total`` samples), only those families are parsed: a
    benchmark that polls a few counters several times a second then costs the process it runs in (the
    sandbox's, often) a fraction of the CPU. Raises ``OSError`` (an HTTP error included) when it does not
    answer within ``timeout_s`` seconds or answers other than 200."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    if names:
        wanted = tuple(names)
        text = "\n".join(line for line in text.splitlines() if _family_line(line).startswith(wanted)) + "\n"
    return parse_metrics(text)


def _family_line(line: str) -> str:
    """A sample line, or a ``# HELP``/``# TYPE`` line without its prefix: what starts with the family name."""
    return line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line


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


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on: the LISTEN rows (state ``0A``) of ``/proc/<pid>/net/tcp`` and
    ``tcp6`` whose socket inode is one of its open descriptors (``/proc/<pid>/fd``, proc(5)); empty when it is
    gone or listens on none."""
    inodes = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for descriptor in descriptors:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there are none)."""
    wanted = labels.items()
    return sum(value for have, value in samples.get(name, []) if wanted <= have.items())


class Process:
    """A started controller process whose output (stdout and stderr) is appended to ``log``, with a metrics
    port and a probes port. :meth:`lines` parses the log as JSON lines (any other line becomes
    ``{"event": line, "raw": True}``)."""

    #: The Kubernetes user it acts as on the real control plane (``system:serviceaccount:<ns>:<name>``).
    username: str = ""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        *,
        metrics_port: int | None = None,
        probes_port: int | None = None,
    ) -> None:
        # None: the port the process chose (it was started with port 0): the one it listens on, once it does
        self._ports = {"metrics": metrics_port, "probes": probes_port}
        self._given = {port for port in (metrics_port, probes_port) if port}
        self.log_path = log
        self._offset = log.stat().st_size if log.exists() else 0
        self.log: IO[str] = log.open("a")
        self.process = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def metrics_port(self) -> int:
        """The port of its metrics server: the one it was given, else the one TCP port it listens on besides
        the ports it was given (see :func:`listening_ports`); 0 while it listens on none yet (or on several:
        then say which)."""
        return self._port("metrics")

    @property
    def probes_port(self) -> int:
        """The port of its probes server, found as :attr:`metrics_port` is."""
        return self._port("probes")

    @property
    def pid(self) -> int:
        """The controller's process ID on this host (where its ports and ``/proc`` entries are read)."""
        return self.process.pid

    def _port(self, which: str) -> int:
        port = self._ports[which]
        if port is None:
            listening = listening_ports(self.pid) - self._given
            if len(listening) != 1:
                return 0
            port = self._ports[which] = listening.pop()
        return port

    def lines(self) -> list[dict[str, Any]]:
        """This process's log lines (JSON objects; any other line as ``{"event": line, "raw": True}``)."""
        with self.log_path.open(errors="replace") as text:
            text.seek(self._offset)
            out = []
            for line in text:
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = {"event": line.rstrip("\n"), "raw": True}
                out.append(parsed if isinstance(parsed, dict) else {"event": line, "raw": True})
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


#: The settings that name its ports, by the :class:`Process` keyword that takes them.
_PORTS = {"metrics_port": "PROMETHEUS_SERVER_PORT", "probes_port": "PROBES_SERVER_PORT"}


class QueueProcessor(Process):
    """``queue-processor run`` (the console script beside this interpreter) against ``sandbox``: the sandbox's
    env file settings, JSON logs, metrics and probes on one listener whose port the controller picks (port 0:
    no other process can take it between a choice and the bind; a port picked beforehand could be, and CI once
    saw a controller exit 2 so); ``extra`` adds or overrides settings (ports given there are used as given)."""

    def __init__(self, sandbox: Sandbox, log: Path, **extra: str) -> None:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            **sandbox.env(),
            "ENABLE_PROMETHEUS_SERVER": "true",
            "PROMETHEUS_SERVER_PORT": "0",
            "PROBES_SERVER_PORT": "0",
            "JSON_LOGGING": "true",
            **extra,
        }
        self.username = sandbox.controller_username
        given = {name: int(env[setting]) or None for name, setting in _PORTS.items()}
        super().__init__(self.command(env), env, log, **given)

    def command(self, env: dict[str, str]) -> list[str]:
        """The command line that starts it with the settings ``env`` (also its environment)."""
        return [str(Path(sys.executable).parent / "queue-processor"), "run"]
