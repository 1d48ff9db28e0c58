"""Shared test helpers: where the message fixtures live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "messages"
# The project's shared samples sit beside the repository in CI (../shared); a user's clone may not have them.
SHARED_SAMPLES = ROOT.parent / "shared" / "samples" / "messages"


@pytest.fixture
def samples_dir() -> Path:
    """../shared/samples/messages; the test is skipped when it is not beside the repository, except in CI,
    where it always is (CI=true): there its absence fails the test."""
    if not SHARED_SAMPLES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED_SAMPLES} is missing in CI")
        pytest.skip(f"{SHARED_SAMPLES} is not beside the repository")
    return SHARED_SAMPLES
