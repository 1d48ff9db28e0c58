"""The path of one Spot warning through the controller (docs/architecture.md, "The path of one Spot warning"),
traced on the emulated sandbox: at most 15 modules of the package, and every call between two of them goes down
the layers of ``tests/unit/test_layers.py``: no callback from a lower layer into a higher one."""

from __future__ import annotations

import os
from unittest.mock import patch

from queue_processor_sandbox.path_trace import spot_path
from tests.unit.test_layers import layer_of


def test_a_spot_warning_goes_down_the_layers_through_at_most_15_modules() -> None:
    with patch.dict(os.environ):  # the sandbox's settings, for this test only
        path = spot_path()
    assert "queue_processor.drain.evictions" in path.modules  # the trace saw the drain
    assert path.upward(layer_of) == []
    assert len(path.modules) <= 15, path.modules
