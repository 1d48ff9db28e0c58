"""Helm, the real one (v3, built by ``make cluster-bin`` from the Go module proxy, pinned in
tools/cluster/helm/go.mod), as the chart's tests and the pod on the real node run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class Helm:
    """``helm`` with its cache, configuration and data in a directory of the test's, and a kubeconfig."""

    def __init__(self, binary: Path, home: Path, kubeconfig: Path | None = None) -> None:
        self.binary = binary
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            **{f"HELM_{what}_HOME": str(home / what.lower()) for what in ("CACHE", "CONFIG", "DATA")},
            **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {}),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``helm args...``; raises ``AssertionError`` with its output when it fails and ``check``."""
        done = subprocess.run(
            [str(self.binary), *args], env=self.env, capture_output=True, text=True, check=False, timeout=600
        )
        assert not check or done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done
