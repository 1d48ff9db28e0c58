"""What a drain did, pure: each eviction's outcome, how each pod's grace went, the :class:`DrainResult` built once
from the plan and the tally, and why a drain did not finish."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from queue_processor.drain.filters import PodDecision
from queue_processor.drain.plan import DrainPod, WavePlan
from queue_processor.outcomes import DrainOutcome, EvictionOutcome


@dataclass
class DrainResult:
    """How a drain ended: ``completed`` when every pod to evict is gone, else ``reason``; ``outcome`` says which. Pod
    counts: ``evicted`` (``cut_short`` with a cut grace), ``blocked`` (by a budget to the end), ``failed``,
    ``skipped`` (by the filters), ``finished_grace``/``outlasted`` (:func:`grace_verdicts`), ``deleted_at_deadline``,
    ``remaining``; ``waves``: pods per wave; ``causes``; ``drain_id``: its evictions' ``drain/<id>`` User-Agent."""

    completed: bool
    outcome: DrainOutcome = DrainOutcome.TIMEOUT
    reason: str | None = None
    evicted: int = 0
    blocked: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[PodDecision] = field(default_factory=list)
    remaining: int = 0
    cut_short: int = 0
    finished_grace: int = 0
    outlasted: int = 0
    deleted_at_deadline: int = 0
    waves: list[int] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    drain_id: str = ""


@dataclass(frozen=True)
class Eviction:
    """How one pod's eviction ended: outcome, detail, last refusing budget, grace given and when (``clock``)."""

    key: tuple[str, str]
    result: EvictionOutcome
    detail: str
    budget: str | None = None
    grace_s: int | None = None
    cut: bool = False
    at: float = 0.0


Grace = Literal["own", "cut", "outlasted"]


def grace_verdicts(
    outcomes: list[Eviction], left: Mapping[tuple[str, str], Any], instance_end: float | None
) -> dict[tuple[str, str], Grace]:
    """How each evicted pod's grace went (pure): ``cut``, ``own`` (all of it before the instance's end, or, that
    unknown, gone by the drain's end) or ``outlasted`` (killed mid-grace when the instance goes)."""
    verdicts: dict[tuple[str, str], Grace] = {}
    for outcome in outcomes:
        if outcome.result is not EvictionOutcome.EVICTED or outcome.grace_s is None:
            continue
        if outcome.cut:
            verdicts[outcome.key] = "cut"
        elif instance_end is not None:
            verdicts[outcome.key] = "own" if outcome.at + outcome.grace_s <= instance_end else "outlasted"
        elif outcome.key not in left:
            verdicts[outcome.key] = "own"
    return verdicts


@dataclass
class Tally:
    """What a drain's execution saw (evictions with re-cuts, grace verdicts, counts, causes)."""

    outcomes: list[Eviction] = field(default_factory=list)
    graces: dict[tuple[str, str], Grace] = field(default_factory=dict)
    remaining: int = 0
    deleted: int = 0
    causes: list[str] = field(default_factory=list)

    def joined(self, later: Tally) -> Tally:
        """What two passes of one drain saw, together."""
        return Tally(
            self.outcomes + later.outcomes,
            {**self.graces, **later.graces},
            self.remaining + later.remaining,
            self.deleted + later.deleted,
            self.causes + later.causes,
        )


def finished(done: Tally) -> bool:
    """Whether a pass ended with every pod gone and no eviction failed."""
    return not done.remaining and not any(o.result is EvictionOutcome.ERROR for o in done.outcomes)


def summarise(planned: WavePlan, done: Tally, drain_id: str) -> DrainResult:
    """The :class:`DrainResult` of a drain (pure): built once, from its plan and what its execution saw."""
    waves = [len(wave) for wave in planned.waves]
    if planned.refused:
        names = ", ".join(f"{d.namespace}/{d.name} ({d.reason})" for d in planned.refused)
        return DrainResult(
            completed=False,
            outcome=DrainOutcome.ERROR,
            reason=f"cannot drain: {names}",
            skipped=planned.skipped,
            causes=[f"the drain filters refuse {names}"],
            drain_id=drain_id,
        )
    evicted = [o for o in done.outcomes if o.result is EvictionOutcome.EVICTED]
    failed = [
        f"{o.key[0]}/{o.key[1]}: {o.detail}" for o in done.outcomes if o.result is EvictionOutcome.ERROR
    ]
    finished = not (done.remaining or failed)
    if failed:
        outcome = DrainOutcome.ERROR
    elif done.remaining:
        outcome = DrainOutcome.TIMEOUT
    else:
        outcome = DrainOutcome.DELETED if done.deleted else DrainOutcome.DRAINED
    verdicts = list(done.graces.values())
    return DrainResult(
        completed=finished,
        outcome=outcome,
        reason=None if finished else "; ".join(done.causes),
        evicted=len(evicted),
        blocked=sum(1 for o in done.outcomes if o.result is EvictionOutcome.PDB_BLOCKED),
        failed=failed,
        skipped=planned.skipped,
        remaining=done.remaining,
        cut_short=sum(1 for o in evicted if o.cut),
        finished_grace=verdicts.count("own"),
        outlasted=verdicts.count("outlasted"),
        deleted_at_deadline=done.deleted,
        waves=waves,
        causes=done.causes,
        drain_id=drain_id,
    )


async def causes(
    blocked: list[Eviction],
    outcomes: list[Eviction],
    left: list[DrainPod],
    budget_status: Callable[[str], Awaitable[str | None]],
) -> list[str]:
    """Why a drain did not finish, a line each: every budget that refused to the end (its arithmetic now from
    ``budget_status(namespace/name)``), every failed eviction, the pods evicted or being deleted still there."""
    lines: list[str] = []
    by_budget: dict[str | None, list[Eviction]] = {}
    for outcome in blocked:
        by_budget.setdefault(outcome.budget, []).append(outcome)
    for budget, refused in by_budget.items():
        names = names_of(f"{o.key[0]}/{o.key[1]}" for o in refused)
        if budget is None:
            lines.append(f"a PodDisruptionBudget refuses the eviction of {names}: {refused[0].detail}")
            continue
        lines.append(
            f"PodDisruptionBudget {budget} refuses the eviction of {names}: "
            + (await budget_status(budget) or refused[0].detail)
        )
    lines += [
        f"eviction of {o.key[0]}/{o.key[1]} failed: {o.detail}"
        for o in outcomes
        if o.result is EvictionOutcome.ERROR
    ]
    evicted = {o.key: o for o in outcomes if o.result in (EvictionOutcome.EVICTED, EvictionOutcome.GONE)}
    stuck = sorted((e for e in left if e.key in evicted or not e.evict), key=lambda e: e.key)
    if stuck:
        names = names_of(
            f"{e.key[0]}/{e.key[1]} (grace {e.granted_s if e.granted_s is not None else e.grace_s} s)"
            if e.evict
            else f"{e.key[0]}/{e.key[1]} (being deleted before the drain)"
            for e in stuck
        )
        lines.append(f"evicted pods did not terminate: {names}")
    return lines


def names_of(names: Iterable[str], most: int = 5) -> str:
    """``a, b, c`` (at most ``most`` names, then ``and N more``)."""
    listed = list(names)
    shown = ", ".join(listed[:most])
    return shown + (f" and {len(listed) - most} more" if len(listed) > most else "")
