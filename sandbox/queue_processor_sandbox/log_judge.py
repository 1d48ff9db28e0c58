"""What only the controllers' own logs can tell the explorer's judge (pure): a cordon undone under a running
drain.

``cordon-undone``: a node given back (``instance back in service: our cordon, taints and label undone``) by one
controller process while another, or the same, had cordoned it and was still draining it (its ``cordoned``
line before the undo, its ``drained`` line for that node after, and no ``cordoned`` in between): the drain
went on evicting from a node back in service, which the scheduler fills again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

__all__ = ["CORDONED", "DRAINED", "UNDONE", "cordons_undone"]

CORDONED = "cordoned"
DRAINED = "drained"
UNDONE = "instance back in service: our cordon, taints and label undone"


def _at(line: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def _drains(lines: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, float]]:
    """(node, cordoned at, drained at) of each drain of one process that ran to its end."""
    found: list[tuple[str, float, float]] = []
    cordoned: dict[str, float] = {}
    for line in lines:
        node, event = line.get("node"), line.get("event")
        if not isinstance(node, str) or "timestamp" not in line:
            continue
        if event == CORDONED:
            cordoned[node] = _at(line)
        elif event == DRAINED and node in cordoned:
            found.append((node, cordoned.pop(node), _at(line)))
    return found


def cordons_undone(processes: Iterable[Sequence[Mapping[str, Any]]]) -> list[str]:
    """The nodes given back while a drain of theirs ran, one ``"<node> at <time>"`` each, from the log lines of
    every controller process (one list per process, in the order written)."""
    by_process = [list(lines) for lines in processes]
    drains = [drain for lines in by_process for drain in _drains(lines)]
    undone = [
        (str(line["node"]), _at(line))
        for lines in by_process
        for line in lines
        if line.get("event") == UNDONE and isinstance(line.get("node"), str) and "timestamp" in line
    ]
    return sorted(
        f"{node} at {datetime.fromtimestamp(at).time().isoformat(timespec='milliseconds')}"
        for node, at in undone
        if any(node == drained and start < at < end for drained, start, end in drains)
    )
