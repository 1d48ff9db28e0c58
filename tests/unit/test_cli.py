"""The command line: inspect, config, version, through click's runner and the installed console script."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from queue_processor import __version__, cli
from queue_processor.cli import configuration_markdown, main
from tests.conftest import ROOT

SPOT = json.dumps(
    {
        "id": "e-1",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "time": "2026-11-22T12:00:00Z",
        "detail": {"instance-id": "i-0abc", "instance-action": "terminate"},
    }
)


def test_inspect_prints_one_json_line_per_file(tmp_path: Path) -> None:
    (tmp_path / "spot.json").write_text(SPOT)
    (tmp_path / "bad.json").write_text("not json")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "spot.json"), str(tmp_path / "bad.json")])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert [line["outcome"] for line in lines] == ["events", "poison"]
    spot, bad = lines
    assert spot["file"] == str(tmp_path / "spot.json")
    assert spot["reason"] is None
    (event,) = spot["events"]
    assert event["kind"] == "spot-interruption"
    assert event["instance_id"] == "i-0abc"
    assert event["time"] == "2026-11-22T12:00:00Z"
    assert event["start_time"] == "2026-11-22T12:02:00Z"
    assert event["event_id"].startswith("spot-interruption-")
    assert "message" not in event
    assert "detail_type" not in event
    assert bad["events"] == []
    assert bad["reason"].startswith("not JSON")


def test_inspect_reads_stdin() -> None:
    result = CliRunner().invoke(main, ["inspect", "-"], input=SPOT)
    assert result.exit_code == 0
    assert json.loads(result.output)["file"] == "-"


def test_inspect_calls_a_notice_ending_past_year_9999_poison() -> None:
    far = SPOT.replace("2026-11-22T12:00:00Z", "9999-12-31T23:59:59Z")
    result = CliRunner().invoke(main, ["inspect", "-"], input=far)
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)
    assert line["outcome"] == "poison"
    assert line["reason"].startswith("time: start time out of range")


def test_inspect_exits_2_when_a_file_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "spot.json").write_text(SPOT)
    result = CliRunner().invoke(
        main, ["inspect", str(tmp_path / "missing.json"), str(tmp_path / "spot.json")]
    )
    assert result.exit_code == 2
    assert "cannot read" in result.stderr
    assert "missing.json" in result.stderr
    assert json.loads(result.stdout)["outcome"] == "events"  # the readable file was still inspected


def test_inspect_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich sizes the table to the terminal; IDs fold on narrow ones
    result = CliRunner().invoke(main, ["inspect", "--format", "table", "-"], input=SPOT)
    assert result.exit_code == 0
    assert "spot-interruption" in result.output
    assert "i-0abc" in result.output


def test_inspect_asg_fields_are_snake_case() -> None:
    body = json.dumps(
        {
            "LifecycleActionToken": "t-1",
            "AutoScalingGroupName": "workers",
            "LifecycleHookName": "drain",
            "EC2InstanceId": "i-1",
            "LifecycleTransition": "autoscaling:EC2_INSTANCE_LAUNCHING",
            "Origin": "WarmPool",
            "Destination": "AutoScalingGroup",
            "Time": "2026-11-22T12:00:00Z",
            "RequestId": "r-1",
        }
    )
    (event,) = json.loads(CliRunner().invoke(main, ["inspect", "-"], input=body).output)["events"]
    assert event["auto_scaling_group_name"] == "workers"
    assert event["lifecycle_hook_name"] == "drain"
    assert event["lifecycle_action_token"] == "t-1"
    assert event["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert (event["origin"], event["destination"]) == ("WarmPool", "AutoScalingGroup")
    assert event["notification_metadata"] is None


def test_config_reports_a_bad_setting_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/q")
    monkeypatch.setenv("HEARTBEAT_INTERVAL", "10")
    result = CliRunner().invoke(main, ["config"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "queue-processor: invalid configuration: HEARTBEAT_INTERVAL=10: must be -1 (automatic), 0 (off) or "
        "30-3600 seconds"
    ]


def test_config_flags_win_and_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/q")
    monkeypatch.setenv("CORDON_ONLY", "false")
    monkeypatch.setenv("WEBHOOK_URL", "https://hooks.example.com/s3cr3t")
    result = CliRunner().invoke(
        main, ["config", "--cordon-only", "--heartbeat-interval", "60", "--webhook-headers", '{"X": "1"}']
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["CORDON_ONLY"] is True
    assert shown["HEARTBEAT_INTERVAL"] == 60
    assert shown["WEBHOOK_HEADERS"] == {"X": "1"}
    assert shown["WEBHOOK_URL"] == "***"
    assert "s3cr3t" not in result.output


def test_an_nth_environment_is_accepted_with_one_warning_per_variable_that_means_nothing_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What NTH's chart sets in queue-processor mode starts the controller; nothing is ignored silently."""
    nth = {
        "ENABLE_SQS_TERMINATION_DRAINING": "true",
        "WORKERS": "10",
        "NODE_NAME": "ip-10-0-0-1.ec2.internal",
        "LOG_FORMAT_VERSION": "1",
        "PROBES_SERVER_ENDPOINT": "/healthz",
        "ENABLE_SPOT_INTERRUPTION_DRAINING": "true",
        "NAMESPACE": "kube-system",
        "POD_NAME": "nth-0",
        "CHECK_ASG_TAG_BEFORE_DRAINING": "true",
        "MANAGED_ASG_TAG": "aws-node-termination-handler/managed",
        "GRACE_PERIOD": "30",
    }
    monkeypatch.setenv("QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/1/q")
    for name, value in nth.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(main, ["config"])
    assert result.exit_code == 0, result.output
    warned = [line.split()[2] for line in result.stderr.splitlines()]
    assert warned == [
        "ENABLE_SQS_TERMINATION_DRAINING",
        "WORKERS",
        "LOG_FORMAT_VERSION",
        "NODE_NAME",
        "PROBES_SERVER_ENDPOINT",
        "ENABLE_SPOT_INTERRUPTION_DRAINING",
    ]
    assert "IN_FLIGHT_BUDGET" in result.stderr  # what replaces WORKERS is named
    assert json.loads(result.stdout)["POD_TERMINATION_GRACE_PERIOD"] == 30  # a renamed one is read


def test_config_reference_is_the_committed_doc() -> None:
    result = CliRunner().invoke(main, ["config", "--reference"])
    assert result.output == configuration_markdown()


def test_version() -> None:
    assert CliRunner().invoke(main, ["version"]).output.strip() == __version__


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = shutil.which("queue-processor", path=str(Path(sys.executable).parent))
    assert script, "the queue-processor console script is not installed next to this Python"
    (tmp_path / "body.json").write_text(SPOT)
    done = subprocess.run(
        [script, "inspect", str(tmp_path / "body.json")],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "events"


def _without_the_sandbox(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A Python command and environment that see this interpreter's packages but not the sandbox's
    distribution: site-packages laid out again (links) without queue-processor-sandbox's metadata and import
    hook, site processing off (-S), the controller and its Go-template distribution found from the repository."""
    site_packages = Path(next(p for p in sys.path if p.endswith("site-packages")))
    view = tmp_path / "site-packages"
    view.mkdir()
    for entry in site_packages.iterdir():
        if "queue_processor_sandbox" not in entry.name and not entry.name.endswith(".pth"):
            (view / entry.name).symlink_to(entry)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}:{ROOT / 'gotemplate'}:{view}"}
    return [sys.executable, "-S", "-c", "from queue_processor.cli import main; main()"], env


def test_where_the_sandbox_is_not_installed_its_command_says_how_to_get_it_in_one_line(
    tmp_path: Path,
) -> None:
    argv, env = _without_the_sandbox(tmp_path)
    probe = subprocess.run(
        [argv[0], "-S", "-c", "import importlib.util as u; print(u.find_spec('queue_processor_sandbox'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "None"  # the view really has no sandbox
    done = subprocess.run(
        [*argv, "sandbox", "--nodes", "3", "--scenario", "spot-storm"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("queue-processor sandbox: the sandbox is not installed")
    assert "pip install -e ./gotemplate -e . -e ./sandbox" in line
    assert "make demo" in line
    listed = subprocess.run([*argv, "--help"], env=env, capture_output=True, text=True, check=True)
    assert "sandbox" in listed.stdout
    assert "Not installed here" in listed.stdout
    # The controller's own commands are untouched.
    version = subprocess.run([*argv, "version"], env=env, capture_output=True, text=True, check=True)
    assert version.stdout.strip() == __version__


def test_where_the_sandbox_is_installed_the_cli_runs_its_command() -> None:
    result = CliRunner().invoke(main, ["sandbox", "--help"])
    assert result.exit_code == 0, result.output
    assert "--scenario" in result.output
    assert "Not installed" not in result.output


def test_listing_the_commands_imports_none_of_the_sandbox() -> None:
    probe = (
        "import sys; from click.testing import CliRunner; from queue_processor.cli import main; "
        "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
        "print([m for m in sys.modules if m.startswith(('queue_processor_sandbox', 'moto'))]); print(r.output)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    imported, _, listing = done.stdout.partition("\n")
    assert imported == "[]"
    assert "sandbox  See `queue-processor sandbox --help`" in listing
    assert "Not installed" not in listing


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("no_such_module_of_ours:command", "cannot be loaded: ModuleNotFoundError"),
        ("os:getcwd", "is not a click command"),
    ],
    ids=["cannot-import", "not-a-command"],
)
def test_a_broken_command_entry_point_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    point = importlib.metadata.EntryPoint(name="sandbox", value=value, group=cli.COMMANDS)
    monkeypatch.setattr(cli, "_entry_points", lambda: {"sandbox": point})
    listed = CliRunner().invoke(main, ["--help"])  # listing never loads it
    assert listed.exit_code == 0, listed.output
    assert "sandbox" in listed.output
    result = CliRunner().invoke(main, ["sandbox", "--nodes", "3"])
    assert result.exit_code == 2
    (line,) = result.output.splitlines()
    assert line.startswith(f"queue-processor sandbox: its entry point {value} (queue_processor.commands) ")
    assert says in line


def test_a_second_termination_signal_after_the_shutdown_does_not_end_the_process_by_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Explorer seed 29 failed once on a loaded machine with 'replica-0 exited -15' (its own pod evicted three
    times in the storyline, each eviction a SIGTERM from the sandbox's kubelet lever, and one more at the end):
    a second SIGTERM that arrives once the event loop that handled the first is closed ends a clean stop by
    the signal's default action. After the shutdown both signals are ignored."""
    import signal

    async def stopped(settings: object, stop: object) -> None:  # the controller ran and stopped on a signal
        return None

    monkeypatch.setattr(cli, "run_controller", stopped)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        cli._run_to_end(object())  # type: ignore[arg-type]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
