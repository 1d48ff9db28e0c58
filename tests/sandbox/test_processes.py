"""A controller process started with port 0 is found on the port it chose: a port picked beforehand and bound
later could be taken by another test worker in between (CI once saw a replica exit 2 that way)."""

from __future__ import annotations

import http.server
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from queue_processor_sandbox.processes import Process, listening_ports, scrape, total

#: A stand-in controller: once the file named by its first argument exists it serves /readyz on a port of its
#: choosing (port 0) and prints that port as a JSON line; it also listens on each port its other arguments name.
SERVER = """
import http.server, os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
server = http.server.HTTPServer(("127.0.0.1", 0), Ready)
also = [http.server.HTTPServer(("127.0.0.1", int(port)), Ready) for port in sys.argv[2:]]
print('{"event": "listening", "port": %d}' % server.server_address[1], flush=True)
server.serve_forever()
"""


def until(predicate: Callable[[], object], what: str) -> None:
    """Until ``predicate()`` holds (bounded: 30 s, a wait and not a timing)."""
    for _ in range(600):
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(what)


def test_a_process_started_with_port_zero_is_reached_on_the_port_it_chose(tmp_path: Path) -> None:
    go = tmp_path / "go"
    process = Process([sys.executable, "-c", SERVER, str(go)], {}, tmp_path / "server.log")
    try:
        until(lambda: process.process.pid and Path(f"/proc/{process.process.pid}/fd").exists(), "started")
        assert (process.metrics_port, process.probes_port) == (0, 0)  # not listening yet: no port
        assert process.get("/readyz")[0] == 0  # unreachable, not someone else's answer
        assert process.metric("queue_processor_actions_total") == 0.0
        go.touch()
        until(lambda: process.lines(), "the port printed")
        chosen = process.lines()[0]["port"]
        assert listening_ports(process.process.pid) == {chosen}
        assert process.metrics_port == process.probes_port == chosen
        assert process.get("/readyz") == (200, "ok")
    finally:
        process.stop(signal.SIGTERM, 10)
    assert listening_ports(process.process.pid) == set()  # gone: no port


def test_ports_given_are_used_as_given_and_the_other_is_the_one_left(tmp_path: Path) -> None:
    # The stand-in listens on a port of its own and on the one given for metrics: the probes port it chose is
    # the other one.
    given = socket.socket()
    given.bind(("127.0.0.1", 0))
    metrics_port = given.getsockname()[1]
    given.close()
    go = tmp_path / "go"
    go.touch()
    argv = [sys.executable, "-c", SERVER, str(go), str(metrics_port)]
    process = Process(argv, {}, tmp_path / "server.log", metrics_port=metrics_port)
    try:
        until(lambda: process.lines(), "the port printed")
        assert listening_ports(process.process.pid) == {metrics_port, process.lines()[0]["port"]}
        assert process.metrics_port == metrics_port
        assert process.probes_port == process.lines()[0]["port"]
    finally:
        process.stop(signal.SIGTERM, 10)


EXPOSITION = """# HELP queue_processor_messages_received_total Messages received.
# TYPE queue_processor_messages_received_total counter
queue_processor_messages_received_total{kind="spot-interruption"} 7.0
queue_processor_messages_received_total{kind="rebalance-recommendation"} 2.0
# HELP queue_processor_messages_received_created Messages received.
# TYPE queue_processor_messages_received_created gauge
queue_processor_messages_received_created{kind="spot-interruption"} 1.7e+09
# HELP queue_processor_in_flight_operations Operations in flight.
# TYPE queue_processor_in_flight_operations gauge
queue_processor_in_flight_operations 3.0
# HELP queue_processor_event_to_cordon_seconds Seconds from receipt to cordon.
# TYPE queue_processor_event_to_cordon_seconds histogram
queue_processor_event_to_cordon_seconds_bucket{le="1.0"} 4.0
queue_processor_event_to_cordon_seconds_bucket{le="+Inf"} 5.0
queue_processor_event_to_cordon_seconds_count 5.0
queue_processor_event_to_cordon_seconds_sum 4.5
"""


def test_a_scrape_of_some_families_reads_what_a_whole_scrape_reads_of_them() -> None:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(EXPOSITION.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        whole = scrape(port)
        some = scrape(
            port, names=("queue_processor_messages_received", "queue_processor_in_flight_operations")
        )
        assert set(whole) > set(some)
        assert some == {name: whole[name] for name in some}
        assert total(some, "queue_processor_messages_received_total", kind="spot-interruption") == 7.0
        assert total(some, "queue_processor_in_flight_operations") == 3.0
        assert "queue_processor_event_to_cordon_seconds_bucket" not in some
    finally:
        server.shutdown()
        server.server_close()
