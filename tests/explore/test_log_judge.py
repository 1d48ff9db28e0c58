"""The judge's reading of the controllers' logs (pure): a node given back while a drain of it ran."""

from __future__ import annotations

from typing import Any

from queue_processor_sandbox.log_judge import CORDONED, DRAINED, UNDONE, cordons_undone


def line(event: str, second: int, node: str = "n1") -> dict[str, Any]:
    return {"timestamp": f"2026-11-28T00:00:{second:02d}.000000Z", "event": event, "node": node}


def test_a_node_given_back_by_another_replica_while_a_drain_of_it_runs_is_caught() -> None:
    draining = [line(CORDONED, 1), line(DRAINED, 9)]
    returns = [line(UNDONE, 5)]
    assert len(cordons_undone([draining, returns])) == 1


def test_a_node_given_back_after_its_drain_ended_or_another_node_is_not() -> None:
    draining = [line(CORDONED, 1), line(DRAINED, 4)]
    assert cordons_undone([draining, [line(UNDONE, 5)]]) == []
    assert cordons_undone([draining, [line(UNDONE, 3, node="n2")]]) == []
    # Cordoned again after the undo: the drain that ends is a new one's.
    again = [line(CORDONED, 1), line(CORDONED, 6), line(DRAINED, 9)]
    assert cordons_undone([again, [line(UNDONE, 5)]]) == []
