"""The sandbox judges a controller that runs outside it: `queue-processor sandbox --no-controller` in one
process publishes a scenario, `queue-processor run` in another does the work, and the sandbox's last line
(after SIGTERM) says what happened: the same summary it prints with the controller in-process, read from the
sandbox alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3

SCRIPT = str(Path(sys.executable).parent / "queue-processor")


def read_env(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value.strip().strip("'\"") for key, value in pairs}


def wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s  # a hang guard, generous for a loaded machine
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        time.sleep(0.2)


def test_the_sandbox_judges_a_controller_in_another_process(tmp_path: Path) -> None:
    workdir = tmp_path / "sandbox"
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path))}
    judge = subprocess.Popen(
        [SCRIPT, "sandbox", "--nodes", "4", "--scale", "0.05", "--scenario", "asg-scale-in", "--no-controller",
         "--workdir", str(workdir)],
        env=base, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    controller = None
    try:
        wait(lambda: (workdir / "sandbox.env").exists() or judge.poll() is not None, 120, "the sandbox up")
        assert judge.poll() is None, "the sandbox ended before it was judged"
        env = read_env(workdir / "sandbox.env")
        controller = subprocess.Popen(
            [SCRIPT, "run"],
            env={**base, **env, "ENABLE_PROMETHEUS_SERVER": "false", "PROBES_SERVER_PORT": "0",
                 "RECEIVE_WAIT_TIME_SEC": "2"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        sqs = boto3.client(
            "sqs",
            endpoint_url=env["AWS_ENDPOINT"],
            region_name=env["AWS_REGION"],
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]

        def settled() -> bool:
            attributes = sqs.get_queue_attributes(QueueUrl=env["QUEUE_URL"], AttributeNames=names)[
                "Attributes"
            ]
            return all(attributes[name] == "0" for name in names)

        wait(settled, 120, "every message settled")
        controller.send_signal(signal.SIGTERM)
        assert controller.wait(timeout=60) == 0
    finally:
        if controller is not None and controller.poll() is None:
            controller.kill()
        judge.send_signal(signal.SIGTERM)
        output, _ = judge.communicate(timeout=60)
    verdict = json.loads(output.strip().splitlines()[-1])
    assert verdict["published"] == {"terminating": 2}
    assert verdict["lifecycle_completed"] == 2
    assert verdict["drained"] >= 2  # the two leaving nodes (gone once their instances terminated)
    clean = ("lifecycle_timed_out", "daemonset_pods_evicted", "messages_left", "dlq", "heartbeats_after_end")
    clean += ("nodes_drained_twice", "evictions_denied")
    assert {key: verdict[key] for key in clean} == dict.fromkeys(clean, 0)
