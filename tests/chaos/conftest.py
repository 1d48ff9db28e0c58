"""Chaos cases start controller processes: none outlives its case, whatever the case's outcome."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.chaos.harness import kill_leftovers


@pytest.fixture(autouse=True)
def no_controller_left() -> Iterator[None]:
    yield
    kill_leftovers()
