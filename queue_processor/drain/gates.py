"""PodDisruptionBudgets that refused an eviction a moment ago, across every drain of the process
(:class:`BudgetGates`), so that the pods they cover wait for the budget instead of asking it.

A budget that allows no disruption answers every eviction of a pod it covers with a 429 (the Eviction API:
https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/). In a storm the drains of hundreds of
nodes evict pods of the same Deployments at once; a budget spent for a second refuses each of them, and every
refusal is a request taken from the client's QPS (KUBE_API_QPS) that the evictions of other workloads, the
cordons and the Lease writes wait for. Measured at 1,000 nodes with three replicas, the refusals were about one
request in eight, nearly all of them a pod's first attempt.

So a refusal closes its budget for a short while (one second; doubled when it refuses again right after it
reopened, at most :data:`GATE_MOST_S`): a pod whose workload (its controller owner, ``metadata.ownerReferences``
with ``controller: true``) the budget refused waits until the budget reopens and is then tried, as a pod refused
itself would be retried after its backoff. The owner stands for the budget because the 429 names the budget (its
``DisruptionBudget`` cause) and not the pods it selects. An accepted eviction of a pod of the workload starts
the budget's backoff over and unlinks the workload, which the next refusal links again: a workload whose pods
were relabelled out of the budget, or a not-Ready pod the budget lets go (``unhealthyPodEvictionPolicy``), waits
at most one closing (up to :data:`GATE_MOST_S`). A pod whose owner no budget refused goes at once. Pure
bookkeeping, no I/O and no timers: the drainer asks :meth:`BudgetGates.closed` before each attempt and sleeps
itself.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

__all__ = ["GATE_FIRST_S", "GATE_FORGET_S", "GATE_MOST_S", "BudgetGates", "Closed"]

#: How long a budget stays closed after its first refusal (seconds): kubectl retries a refused eviction after
#: 5 s; a storm's budgets reopen within about a second as the replacements turn Ready.
GATE_FIRST_S = 1.0

#: The longest closing (seconds), reached by doubling while the budget refuses the pods tried at each reopening.
GATE_MOST_S = 10.0

#: A budget that refused nothing for this long (seconds) is forgotten, with the owners learnt for it.
GATE_FORGET_S = 300.0


@dataclass
class Closed:
    """A closed budget: its name (``namespace/name``), when it reopens (a ``clock`` reading, seconds), how long
    this closing lasts (seconds) and the message of the refusal that closed it (the 429's, for the drain's
    causes)."""

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
    """Budgets that refused an eviction lately, and the owners whose pods they covered (see the module). One
    event loop; not thread-safe. Times are readings of the caller's clock, in seconds."""

    def __init__(self) -> None:
        self._budgets: dict[str, _Budget] = {}
        self._owners: dict[str, str] = {}  # controller owner uid → the budget that refused one of its pods

    def closed(self, owner: str | None, now: float) -> Closed | None:
        """The budget that closed on ``owner``'s pods and until when, or ``None`` when a pod of ``owner``
        (``None``: it has no controller) may be tried now."""
        name = None if owner is None else self._owners.get(owner)
        budget = None if name is None else self._budgets.get(name)
        if name is None or budget is None or budget.until <= now:
            return None
        return Closed(name, budget.until, budget.length_s, budget.message)

    def refused(self, owner: str | None, budget: str, message: str, now: float) -> None:
        """A 429 of ``budget`` (``namespace/name``, named by its ``DisruptionBudget`` cause) for a pod of
        ``owner``: the owner's pods wait for it from now, and the budget closes unless it is closed already. A
        closing lasts :data:`GATE_FIRST_S`, or twice the last (up to :data:`GATE_MOST_S`) when the budget
        refuses again within the last closing's length of its reopening with no eviction accepted since."""
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
        """An eviction of a pod of ``owner`` was accepted: the budget that refused its pods allowed one (its next
        closing is the first's again), and the owner is unlinked from it until it refuses one again."""
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
