"""The modules one Spot warning passes through (:mod:`queue_processor_sandbox.path_trace`), printed in the order
they were first entered, with each module's layer (``tests/unit/test_layers.py`` ``LAYERS``, bottom 0) and every
call between two modules that goes up the layers (a callback: none expected). The last line is JSON:
``{"modules", "count", "crossings", "calls_between_modules", "upward"}``.

Usage: ``.venv/bin/python benchmarks/spot_path.py`` (about 15 s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.unit.test_layers

from queue_processor_sandbox.path_trace import PACKAGE, spot_path
from tests.unit.test_layers import layer_of


def main() -> None:
    path = spot_path()
    short = [module.removeprefix(PACKAGE + ".") for module in path.modules]
    print(f"{len(short)} modules, in the order first entered (layer in brackets):")
    for index, module in enumerate(path.modules, 1):
        print(f"  {index:2d}. {module.removeprefix(PACKAGE + '.')} [{layer_of(module)}]")
    upward = path.upward(layer_of)
    print(f"{len(path.crossings)} module-to-module crossings, {sum(path.crossings.values())} calls")
    print(f"{len(upward)} going up the layers" + "".join(f"\n  {crossing}" for crossing in upward))
    print(
        json.dumps(
            {
                "modules": short,
                "count": len(short),
                "crossings": len(path.crossings),
                "calls_between_modules": sum(path.crossings.values()),
                "upward": upward,
            }
        )
    )


if __name__ == "__main__":
    main()
