"""PodDisruptionBudget gates (:mod:`queue_processor.drain.evictions`): pure bookkeeping on a given clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from queue_processor.drain.evictions import GATE_FIRST_S, GATE_FORGET_S, GATE_MOST_S, BudgetGates

MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."


def test_a_refusal_closes_the_budget_for_the_workload_it_refused_and_no_other() -> None:
    gates = BudgetGates()
    assert gates.closed("rs-web", 100.0) is None  # nothing learnt: tried at once
    gates.refused("rs-web", "apps/web", MESSAGE, 100.0)
    closed = gates.closed("rs-web", 100.0)
    assert closed is not None
    assert (closed.budget, closed.until, closed.message) == ("apps/web", 100.0 + GATE_FIRST_S, MESSAGE)
    assert gates.closed("rs-db", 100.0) is None  # another workload goes on
    assert gates.closed(None, 100.0) is None  # a pod without a controller is never held
    assert gates.closed("rs-web", 100.0 + GATE_FIRST_S) is None  # reopened


def test_refusals_at_each_reopening_double_the_closing_and_an_accepted_eviction_starts_it_over() -> None:
    gates = BudgetGates()
    now, closings = 0.0, []
    for _ in range(6):
        gates.refused("rs-web", "apps/web", MESSAGE, now)
        gates.refused("rs-web", "apps/web", MESSAGE, now)  # a second refusal while closed changes nothing
        closed = gates.closed("rs-web", now)
        assert closed is not None
        closings.append(closed.until - now)
        now = closed.until
    assert closings == [1.0, 2.0, 4.0, 8.0, GATE_MOST_S, GATE_MOST_S]
    gates.accepted("rs-web")
    assert gates.closed("rs-web", now) is None  # unlinked until the next refusal
    gates.refused("rs-web", "apps/web", MESSAGE, now)
    closed = gates.closed("rs-web", now)
    assert closed is not None
    assert closed.until - now == closed.length_s == GATE_FIRST_S


def test_a_refusal_long_after_the_last_closing_closes_for_the_first_length_again() -> None:
    # The doubling is for a budget that refuses again as soon as it reopens; quiet for longer than its last
    # closing (another replica's evictions accepted meanwhile, which this one never sees), it starts over.
    gates = BudgetGates()
    gates.refused("rs-web", "apps/web", MESSAGE, 0.0)
    gates.refused("rs-web", "apps/web", MESSAGE, 1.0)  # at the reopening: 2 s
    gates.refused("rs-web", "apps/web", MESSAGE, 3.5)  # 0.5 s after it: 4 s
    closed = gates.closed("rs-web", 3.5)
    assert closed is not None
    assert closed.length_s == 4.0
    gates.refused("rs-web", "apps/web", MESSAGE, 7.5 + 4.1)  # 4.1 s after the reopening: quiet
    closed = gates.closed("rs-web", 11.6)
    assert closed is not None
    assert closed.length_s == GATE_FIRST_S


def test_a_workload_refused_by_another_budget_follows_it() -> None:
    gates = BudgetGates()
    gates.refused("rs-web", "apps/old", MESSAGE, 0.0)
    gates.refused("rs-web", "apps/new", "the new one", 0.5)
    closed = gates.closed("rs-web", 0.5)
    assert closed is not None
    assert (closed.budget, closed.message) == ("apps/new", "the new one")


def test_a_budget_quiet_for_long_is_forgotten_with_its_workloads() -> None:
    gates = BudgetGates()
    gates.refused("rs-web", "apps/web", MESSAGE, 0.0)
    gates.refused("rs-db", "apps/db", MESSAGE, GATE_FORGET_S)
    assert len(gates._budgets) == 2  # forgetting happens when a new budget is learnt
    gates.refused("rs-api", "apps/api", MESSAGE, GATE_FORGET_S + 1.0)
    assert len(gates._budgets) == 2
    gates.refused("rs-web", "apps/web", MESSAGE, GATE_FORGET_S + 1.0)  # learnt again, closing from the first
    closed = gates.closed("rs-web", GATE_FORGET_S + 1.0)
    assert closed is not None
    assert closed.until == GATE_FORGET_S + 1.0 + GATE_FIRST_S


@given(
    st.lists(
        st.tuples(st.sampled_from(["rs-a", "rs-b", None]), st.booleans(), st.floats(0.0, 30.0)),
        max_size=40,
    )
)
def test_a_closing_never_outlasts_the_longest_and_holds_only_a_workload_refused_since_it_was_accepted(
    steps: list[tuple[str | None, bool, float]],
) -> None:
    gates = BudgetGates()
    now = 0.0
    linked: set[str] = set()  # refused since their last accepted eviction
    for owner, refusal, elapsed in steps:
        now += elapsed
        if refusal:
            gates.refused(owner, f"apps/{owner}", MESSAGE, now)
            if owner is not None:
                linked.add(owner)
        else:
            gates.accepted(owner)
            linked.discard(owner or "")
        for who in ("rs-a", "rs-b", None):
            closed = gates.closed(who, now)
            if closed is not None:
                assert who in linked
                assert now < closed.until <= now + GATE_MOST_S
                assert GATE_FIRST_S <= closed.length_s <= GATE_MOST_S
