"""Every sandbox scenario, end to end with the controller, on both Kubernetes API servers: the emulation and the
real control plane (where the controller runs as a ServiceAccount whose only rights are the ClusterRole and Role
that the Helm chart renders, and must get no 403). What is judged is
what ``queue-processor sandbox --scenario`` judges (:func:`queue_processor_sandbox.run.as_expected`): no message
left, nothing in the dead-letter queue but poison, no DaemonSet pod evicted, no lifecycle action timed out, no
task left behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from queue_processor.cli import main
from queue_processor_sandbox.cluster import ClusterSpec
from queue_processor_sandbox.environment import REAL_ONLY, SCENARIOS, Sandbox, SandboxOptions
from queue_processor_sandbox.run import as_expected, run_scenario
from tests.conftest import KUBERNETES


@pytest.mark.parametrize(
    ("scenario", "kubernetes"),
    [
        (scenario, kubernetes)
        for scenario in sorted(SCENARIOS)
        for kubernetes in KUBERNETES
        if kubernetes == "real" or scenario not in REAL_ONLY  # the emulation serves no Deployments
    ],
)
async def test_the_scenario_ends_as_expected(
    scenario: str,
    kubernetes: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = kubernetes == "real"
    plane = request.getfixturevalue("control_plane") if real else None
    rbac = request.getfixturevalue("chart_rbac") if real else None  # the chart's rules, rendered by Helm
    # A surge waits at least SURGE_LEAST_S (10 real seconds) for a replacement: the notice must leave that
    # in real time (120 simulated seconds at 0.25 are 30 s).
    scale = 0.25 if scenario == "surge" else 0.05
    options = SandboxOptions(
        nodes=6, scale=scale, node_register_s=20, node_ready_s=10, cluster=ClusterSpec(apps=4)
    )
    with Sandbox(
        options, workdir=tmp_path / "sandbox", kubernetes=kubernetes, plane=plane, rbac=rbac
    ) as sandbox:  # type: ignore[arg-type]
        for key, value in sandbox.env().items():
            monkeypatch.setenv(key, value)
        summary = await run_scenario(sandbox, scenario, timeout_s=120)
        if kubernetes == "real":
            assert not sandbox.kube.denied()  # type: ignore[attr-defined]
    assert as_expected(summary), json.dumps(summary)  # the whole summary, not pytest's shortened repr
    if scenario in ("spot-storm", "asg-scale-in", "mixed-duplicates", "pdb-blocked"):
        assert summary["evicted"] >= 1
    if scenario == "spot-critical":
        # The 300 s grace period outlasts the 120 s notice: cut (on a slow machine, a late eviction may cut
        # others too). The ledger pod, held by its budget, is deleted just before the instance goes. No pod
        # was left to be killed mid-grace; mesh, orders and reports all went one way or the other.
        assert summary["pods_cut_short"] >= 1, summary
        assert summary["pods_deleted_at_deadline"] >= 1, summary
        assert summary["pods_killed_mid_grace"] == 0, summary
        assert summary["pods_finished_grace"] + summary["pods_cut_short"] >= 4, summary
    if scenario == "two-clusters":
        # as_expected checks that each cluster drained its two leaving nodes and touched nothing else, and
        # that both queues and dead-letter queues are empty: here, that both clusters were judged
        assert set(summary["clusters"]) == {"blue", "green"}, summary
        assert all(figures["drained"] == 2 for figures in summary["clusters"].values()), summary
    if scenario == "surge":
        # the replacement was Ready before the pod went (as_expected checks fewest_ready_replicas >= 1 and
        # that the Deployment ends with 1 replica and no record), and the controller counted it so
        assert summary["fewest_ready_replicas"] == 1, summary
        assert summary["pods_surged"] == 1, summary
    if scenario == "rebalance-fleet":
        # Four of six nodes of one group recommended for rebalancing at once; DRAIN_BUDGET_NON_URGENT=1: each
        # drained in its turn (as_expected checks most_draining_at_once <= 1), all of them in the end.
        assert summary["drained"] == 4, summary
        assert summary["most_draining_at_once"] == 1, summary
    if scenario == "drain-policy":
        # The agent annotated last went after web-0..2 and the cache with the typo (judged by as_expected:
        # last_pods_evicted_early == 0); all five were evicted and the node drained.
        assert summary["evicted"] >= 5, summary
        assert summary["drained"] == 1, summary
    if scenario in ("asg-scale-in", "mixed-duplicates", "pdb-blocked"):
        # Not spot-storm: it interrupts every node at once, so no evicted pod can be rescheduled and the
        # PodDisruptionBudgets may rightly keep every node from draining fully inside its 6 s notice.
        assert summary["drained"] >= 1


def test_the_sandbox_command_runs_a_scenario_on_the_real_control_plane(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("control_plane")  # skips (or fails in CI) where the control plane cannot run
    result = CliRunner().invoke(
        main,
        [
            "sandbox",
            "--kubernetes",
            "real",
            "--nodes",
            "4",
            "--scale",
            "0.05",
            "--scenario",
            "asg-scale-in",
            "--workdir",
            str(tmp_path / "sb"),
        ],
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.exit_code == 0, summary
    assert summary["lifecycle_completed"] == 2
    assert summary["drained"] == 2
    assert (tmp_path / "sb" / "admin.kubeconfig").is_file()
    assert "POD_NAMESPACE=" in (tmp_path / "sb" / "sandbox.env").read_text()
    (stopped,) = [line for line in result.stdout.splitlines() if " stopped " in line]
    assert "tasks_left=0" in stopped  # the sandbox's own task is not the controller's
