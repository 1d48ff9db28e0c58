"""PodDisruptionBudgets that refused an eviction a moment ago, across every drain (:class:`BudgetGates`): the pods they
cover wait for the budget to reopen instead of spending requests on 429s. The pod's controller owner stands for the
budget, as a 429 names the budget, not the pods it selects. Pure bookkeeping: no I/O, no timers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["GATE_FIRST_S", "GATE_FORGET_S", "GATE_MOST_S", "BudgetGates", "Closed"]

#: How long a budget stays closed after its first refusal (seconds; kubectl retries after 5 s).
GATE_FIRST_S = 1.0

#: The longest closing (seconds), reached by doubling while the budget refuses the pods tried at each reopening.
GATE_MOST_S = 10.0

#: A budget that refused nothing for this long (seconds) is forgotten, with the owners learnt for it.
GATE_FORGET_S = 300.0


@dataclass
class Closed:
    """A closed budget: when it reopens (a clock reading), this closing's length (seconds), the 429's message."""

    budget: str
    until: float
    length_s: float
    message: str


@dataclass
class _Budget:
    until: float  # when it reopens
    length_s: float  # how long its last closing lasted; 0 after an accepted eviction
    message: str
    last: float  # when it last refused


class BudgetGates:
    """Budgets that refused lately and the owners they cover; times are caller clock readings (seconds). One
    event loop; not thread-safe."""

    def __init__(self) -> None:
        self._budgets: dict[str, _Budget] = {}
        self._owners: dict[str, str] = {}  # controller owner uid → the budget that refused one of its pods

    def closed(self, owner: str | None, now: float) -> Closed | None:
        """The budget closed on ``owner``'s pods, or ``None`` when they may be tried now (no ``owner``: always)."""
        name = None if owner is None else self._owners.get(owner)
        budget = None if name is None else self._budgets.get(name)
        if name is None or budget is None or budget.until <= now:
            return None
        return Closed(name, budget.until, budget.length_s, budget.message)

    def refused(self, owner: str | None, budget: str, message: str, now: float) -> None:
        """A 429 of ``budget`` for a pod of ``owner``: link them and close the budget unless closed, for
        :data:`GATE_FIRST_S`, or twice the last closing (up to :data:`GATE_MOST_S`) when it refuses again right
        after."""
        if owner is not None:
            self._owners[sys.intern(owner)] = budget
        state = self._budgets.get(budget)
        if state is None:
            self._forget(now)
            state = self._budgets[budget] = _Budget(now, 0.0, message, now)
        state.last = now
        if state.until <= now:
            again = state.length_s > 0 and now - state.until <= state.length_s
            state.length_s = min(state.length_s * 2, GATE_MOST_S) if again else GATE_FIRST_S
            state.until = now + state.length_s
            state.message = message

    def accepted(self, owner: str | None) -> None:
        """An eviction of ``owner``'s pod was accepted: reset its budget's backoff and unlink the owner."""
        name = None if owner is None else self._owners.pop(owner, None)
        state = None if name is None else self._budgets.get(name)
        if state is not None:
            state.length_s = 0.0

    def _forget(self, now: float) -> None:
        stale = {name for name, state in self._budgets.items() if now - state.last > GATE_FORGET_S}
        if stale:
            for name in stale:
                del self._budgets[name]
            self._owners = {owner: name for owner, name in self._owners.items() if name not in stale}

    def __len__(self) -> int:
        """How many budgets are remembered."""
        return len(self._budgets)
