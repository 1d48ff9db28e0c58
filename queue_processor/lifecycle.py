"""Auto Scaling lifecycle actions: heartbeats from first receipt to the end, and CompleteLifecycleAction.
Per "Amazon EC2 Auto Scaling lifecycle hooks" and the API Reference: a heartbeat restarts the hook's HeartbeatTimeout;
an action over answers ``ValidationError: No active Lifecycle Action found``. :class:`Lifecycle` makes the calls;
:class:`Heartbeats` beats each action until it is over, HEARTBEAT_UNTIL passes, or shutdown."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import structlog
from botocore.exceptions import ClientError

from queue_processor import rest
from queue_processor.aws import call, error_code, is_no_active_action, is_retryable
from queue_processor.config import Settings
from queue_processor.events import ActionKey, AsgLifecycleEvent
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import HeartbeatResult, LifecycleResult

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_autoscaling import AutoScalingClient

log = structlog.get_logger("queue_processor.lifecycle")

#: The longest an instance can be kept in a wait state: 48 hours (or 100 x HeartbeatTimeout if smaller).
MAX_HEARTBEAT_UNTIL_S = 172_800.0

#: Seconds before a failed heartbeat (or hook read) is tried again: doubling from the first to the second.
RETRY_S = (2.0, 10.0)

#: How far past due (a fraction of the interval) a requeued action's beat waits for a receive to take it again.
DEFER_MAX = 0.25


def action_params(action: AsgLifecycleEvent) -> dict[str, str]:
    """The parameters that address ``action`` in the lifecycle API calls: its token, else its instance."""
    by = "LifecycleActionToken" if action.lifecycle_action_token else "InstanceId"
    return {
        "AutoScalingGroupName": action.auto_scaling_group_name,
        "LifecycleHookName": action.lifecycle_hook_name,
        by: action.lifecycle_action_token or action.instance_id,
    }


class Lifecycle:
    """Single lifecycle API calls through an aiobotocore Auto Scaling client; ``observer`` is told results."""

    def __init__(
        self, autoscaling: AutoScalingClient, settings: Settings, *, observer: Observer = NULL_OBSERVER
    ) -> None:
        self.autoscaling = autoscaling
        self.settings = settings
        self.observer = observer
        self._hooks: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._checked: set[tuple[str, str]] = set()
        self._sizes: dict[str, tuple[float, int | None]] = {}  # group → (read at, size)
        self._reading: dict[str, asyncio.Future[int | None]] = {}  # group → the read in flight
        self._told: set[str] = set()  # the errors of waiting() logged once

    async def group_size(self, group: str, *, ttl_s: float = 60.0) -> int | None:
        """Instances in Auto Scaling group ``group`` (DescribeAutoScalingGroups), read at most every ``ttl_s``
        seconds, one caller at a time; on failure the last size, or ``None``. Raises only ``CancelledError``."""
        cached = self._sizes.get(group)
        if cached is not None and time.monotonic() - cached[0] < ttl_s:
            return cached[1]
        reading = self._reading.get(group)
        if reading is None:
            reading = asyncio.ensure_future(self._read_size(group, cached[1] if cached else None))
            self._reading[group] = reading
            reading.add_done_callback(lambda _: self._reading.pop(group, None))
        return await asyncio.shield(reading)

    async def _read_size(self, group: str, last: int | None) -> int | None:
        size = last
        try:
            answer = await call(self.autoscaling.describe_auto_scaling_groups, AutoScalingGroupNames=[group])
            groups = answer.get("AutoScalingGroups") or []
            size = len(groups[0].get("Instances") or []) if groups else last
        except Exception as exc:
            log.warning("cannot read the Auto Scaling group's size", group=group, error=repr(exc))
        self._sizes[group] = (time.monotonic(), size)
        return size

    async def hook_timeout_s(self, group: str, hook: str, *, quiet: bool = False) -> float | None:
        """The hook's HeartbeatTimeout in seconds (DescribeLifecycleHooks, cached); ``None`` when not found or not
        readable (warned once unless ``quiet``). Raises a retryable error whose retries are exhausted."""
        timeout = (await self._hook(group, hook, quiet=quiet) or {}).get("HeartbeatTimeout")
        return float(timeout) if timeout is not None else None

    async def default_result(self, group: str, hook: str) -> Literal["CONTINUE", "ABANDON"]:
        """The hook's ``DefaultResult`` (DESIGN.md rule 9), ``ABANDON`` if unreadable; raises only CancelledError."""
        try:
            described = await self._hook(group, hook, quiet=True)
        except ClientError:
            return "ABANDON"
        result = (described or {}).get("DefaultResult")
        return "CONTINUE" if result == "CONTINUE" else "ABANDON"

    async def _hook(self, group: str, hook: str, *, quiet: bool) -> dict[str, Any] | None:
        """The hook as DescribeLifecycleHooks describes it, cached (see :meth:`hook_timeout_s`)."""
        key = (group, hook)
        if key not in self._hooks:
            try:
                answer = await call(
                    self.autoscaling.describe_lifecycle_hooks,
                    AutoScalingGroupName=group,
                    LifecycleHookNames=[hook],
                )
            except ClientError as exc:
                if is_retryable(exc):
                    raise
                if quiet:
                    return None  # not cached: a later automatic read still warns
                self.observer.heartbeat(HeartbeatResult.HOOK_UNREADABLE)
                log.warning(
                    "cannot read the lifecycle hook's HeartbeatTimeout: its actions get no heartbeats; grant "
                    "autoscaling:DescribeLifecycleHooks or set HEARTBEAT_INTERVAL",
                    group=group,
                    hook=hook,
                    code=error_code(exc),
                )
                self._hooks[key] = None
                return None
            hooks = answer.get("LifecycleHooks") or []
            self._hooks[key] = dict(hooks[0]) if hooks else None
        return self._hooks[key]

    async def interval_s(self, action: AsgLifecycleEvent) -> float | None:
        """Seconds between heartbeats: HEARTBEAT_INTERVAL, or (-1) half the hook's HeartbeatTimeout; ``None`` for
        none (0, or the hook unknown or unreadable). Warns once per hook when HEARTBEAT_INTERVAL is not shorter than
        its HeartbeatTimeout. Raises a retryable error with retries exhausted."""
        configured = float(self.settings.heartbeat_interval)
        key = (action.auto_scaling_group_name, action.lifecycle_hook_name)
        if configured == 0:
            return None
        if configured < 0:
            timeout = await self.hook_timeout_s(*key)
            return timeout / 2 if timeout else None
        if key not in self._checked:
            self._checked.add(key)
            try:
                timeout = await self.hook_timeout_s(*key, quiet=True)
            except ClientError:
                timeout = None
            if timeout is not None and configured >= timeout:
                log.warning(
                    "HEARTBEAT_INTERVAL is not shorter than the lifecycle hook's HeartbeatTimeout: its actions time "
                    "out between heartbeats; lower HEARTBEAT_INTERVAL or set it to -1 (automatic)",
                    group=key[0],
                    hook=key[1],
                    heartbeat_interval_s=configured,
                    heartbeat_timeout_s=timeout,
                )
        return configured

    def until_s(self) -> float:
        """How long heartbeats may go on for one action (HEARTBEAT_UNTIL, or AWS's 48 h limit)."""
        until = self.settings.heartbeat_until
        return float(until) if until > 0 else MAX_HEARTBEAT_UNTIL_S

    async def waiting(self, action: AsgLifecycleEvent) -> bool | None:
        """Whether DescribeAutoScalingInstances says ``LifecycleState`` ``[Warmed:]Pending:Wait`` or
        ``[Warmed:]Terminating:Wait`` (still in the hook); ``None`` when unknown. Raises only ``CancelledError``."""
        try:
            answer = await call(
                self.autoscaling.describe_auto_scaling_instances, InstanceIds=[action.instance_id]
            )
        except Exception as exc:
            code = error_code(exc) or type(exc).__name__
            if code not in self._told:
                self._told.add(code)
                log.warning(
                    "cannot tell whether a lifecycle action still waits: it is heartbeated",
                    error=repr(exc),
                    iam="autoscaling:DescribeAutoScalingInstances",
                )
            return None
        states = [str(found.get("LifecycleState", "")) for found in answer.get("AutoScalingInstances") or []]
        wait = "Pending:Wait" if "LAUNCHING" in action.lifecycle_transition else "Terminating:Wait"
        return any(state in (wait, f"Warmed:{wait}") for state in states)

    async def beat(self, action: AsgLifecycleEvent) -> bool:
        """RecordLifecycleActionHeartbeat: ``False`` when the action is over. Raises other AWS errors after retries."""
        try:
            await call(self.autoscaling.record_lifecycle_action_heartbeat, **action_params(action))
        except Exception as exc:
            if is_no_active_action(exc):
                self.observer.heartbeat(HeartbeatResult.VALIDATION_ERROR)
                return False
            self.observer.heartbeat(HeartbeatResult.ERROR)
            raise
        self.observer.heartbeat(HeartbeatResult.OK)
        return True

    async def complete(
        self, action: AsgLifecycleEvent, result: Literal["CONTINUE", "ABANDON"] = "CONTINUE"
    ) -> LifecycleResult:
        """CompleteLifecycleAction: ``continue``/``abandon``/``no-active-action``. Raises AWS errors after retries."""
        try:
            await call(
                self.autoscaling.complete_lifecycle_action,
                LifecycleActionResult=result,
                **action_params(action),
            )
        except Exception as exc:
            if is_no_active_action(exc):
                self.observer.lifecycle_completion(LifecycleResult.NO_ACTIVE_ACTION)
                return LifecycleResult.NO_ACTIVE_ACTION
            self.observer.lifecycle_completion(LifecycleResult.ERROR)
            raise
        outcome = LifecycleResult.CONTINUE if result == "CONTINUE" else LifecycleResult.ABANDON
        self.observer.lifecycle_completion(outcome)
        return outcome


@dataclass
class _Beat:
    action: AsgLifecycleEvent
    task: asyncio.Task[None]
    requeued_until: float | None = None  # clock reading; None while a receive of ours holds the action
    visible_at: float | None = None  # clock reading: when the requeued message is back in the queue
    held_until: float | None = None  # clock reading: when our hold of the message lapses; None: never
    held: asyncio.Event = field(default_factory=asyncio.Event)  # set while a receive of ours holds it
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)  # set by a receive or a renewal


class Heartbeats:
    """Every lifecycle action's heartbeat task; ``clock``: monotonic seconds, ``sleep``; a renewal holds ``hold_s``."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        hold_s: float | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        self.clock = clock
        self.sleep = sleep
        self.hold_s = hold_s
        self._beats: dict[ActionKey, _Beat] = {}
        self._over: dict[ActionKey, float] = {}  # → clock reading when it ended (kept MAX_HEARTBEAT_UNTIL_S)
        self._completing: set[ActionKey] = set()  # actions whose completion is on its way

    @property
    def running(self) -> int:
        return len(self._beats)

    def start(self, action: AsgLifecycleEvent) -> None:
        """Heartbeat ``action`` from now on (idempotent; a requeued one is held again). Never waits."""
        key = action.action_key
        beat = self._beats.get(key)
        if beat is None:
            if key in self._over or key in self._completing:
                return
            name = f"heartbeat-{action.instance_id}-{action.lifecycle_hook_name}"
            beat = self._beats[key] = _Beat(action, rest.spawn(self._run(action), name=name))
            beat.task.add_done_callback(functools.partial(self._forget, key))
        beat.requeued_until = beat.visible_at = None
        beat.held.set()
        self.hold([key])

    def hold(self, keys: Iterable[ActionKey]) -> None:
        """The messages carrying ``keys``' actions are ours for another ``hold_s`` seconds: beat on."""
        for key in keys:
            beat = self._beats.get(key)
            if beat is not None:
                beat.held_until = None if self.hold_s is None else self.clock() + self.hold_s
                beat.confirmed.set()

    def requeued(self, action: AsgLifecycleEvent, visible_in_s: float, for_s: float) -> None:
        """The action's message was requeued, visible in ``visible_in_s`` seconds: beat on until then, then only as
        the HeartbeatTimeout needs (:data:`DEFER_MAX`); stop in ``for_s`` seconds unless :meth:`start` comes again."""
        beat = self._beats.get(action.action_key)
        if beat is not None:
            now = self.clock()
            beat.visible_at = now + visible_in_s
            beat.requeued_until = now + max(for_s, visible_in_s)
            beat.held.clear()
            beat.confirmed.set()  # a beat waiting for its hold to be confirmed looks again: it is requeued

    async def stop(self, action: AsgLifecycleEvent) -> None:
        """Stop the action's heartbeat and wait until its task has ended."""
        beat = self._beats.pop(action.action_key, None)
        if beat is not None:
            await rest.stop(beat.task)

    async def complete(
        self, action: AsgLifecycleEvent, result: Literal["CONTINUE", "ABANDON"] = "CONTINUE"
    ) -> LifecycleResult:
        """Complete ``action`` (:meth:`Lifecycle.complete`), its heartbeat stopped; on failure restarted, and raised."""
        key = action.action_key
        self._completing.add(key)
        try:
            await self.stop(action)
            outcome = await self.lifecycle.complete(action, result)
        except BaseException:
            self._completing.discard(key)
            self.start(action)
            raise
        self._mark_over(key)
        self._completing.discard(key)
        return outcome

    def over(self, action: AsgLifecycleEvent) -> bool:
        """Whether ``action`` was completed here or AWS said it is over."""
        return action.action_key in self._over

    async def close(self) -> None:
        """Stop every heartbeat (shutdown: nothing beats after the controller exits)."""
        beats = list(self._beats.values())
        self._beats.clear()
        await rest.stop(*(beat.task for beat in beats))

    def _mark_over(self, key: ActionKey) -> None:
        now = self.clock()
        if len(self._over) >= 10_000:  # a lifecycle action lasts 48 h at most: older ones cannot come back
            self._over = {k: t for k, t in self._over.items() if now - t < MAX_HEARTBEAT_UNTIL_S}
        self._over[key] = now

    def _forget(self, key: ActionKey, task: asyncio.Task[None]) -> None:
        beat = self._beats.get(key)
        if beat is not None and beat.task is task:
            del self._beats[key]

    async def _run(self, action: AsgLifecycleEvent) -> None:
        bound = log.bind(
            instance_id=action.instance_id,
            group=action.auto_scaling_group_name,
            hook=action.lifecycle_hook_name,
        )
        interval_s = await self._interval_s(action, bound)
        if interval_s is None:
            return
        deadline = self.clock() + self.lifecycle.until_s()
        # The hook's timer runs from the action's start: an action older than ``interval_s`` is due at once.
        age_s = (datetime.now(UTC) - action.time).total_seconds()
        wait_s = min(interval_s, max(interval_s - age_s, 0.0))
        if wait_s <= 0 and await self.lifecycle.waiting(action) is False:
            # Due at once: the action of a message received again may be over already.
            self._mark_over(action.action_key)
            bound.info("lifecycle action is over already: no heartbeat")
            return
        last_ok = self.clock() - min(max(age_s, 0.0), interval_s)  # when the hook's timer last restarted
        retry_s = RETRY_S[0]
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                bound.info("HEARTBEAT_UNTIL reached: heartbeats stop")
                return
            await self.sleep(min(wait_s, remaining))
            beat = self._beats.get(action.action_key)
            if beat is not None and await self._over_while_requeued(
                action, beat, last_ok + (1.0 + DEFER_MAX) * interval_s
            ):
                bound.info("lifecycle action is over: heartbeats stop")
                return
            if beat is not None and beat.requeued_until is not None and self.clock() >= beat.requeued_until:
                bound.info("requeued lifecycle action not received again: heartbeats stop")
                return
            if self.clock() >= deadline:
                continue
            held_until = beat.held_until if beat is not None and beat.visible_at is None else None
            if beat is not None and held_until is not None and self.clock() > held_until:
                # Our hold lapsed (a paused process, failed renewals): the action may be another's, or over.
                bound.info("the action's message may no longer be ours: heartbeats wait for it")
                beat.confirmed.clear()
                await beat.confirmed.wait()  # a receive, a renewal or a requeue: look again at once
                wait_s = 0.0
                continue
            try:
                alive = await self.lifecycle.beat(action)
            except Exception as exc:  # throttled, 5xx or unreachable after retries: again within seconds
                bound.warning(
                    "heartbeat failed: retrying", code=error_code(exc), error=repr(exc), retry_in_s=retry_s
                )
                wait_s = min(retry_s, interval_s)
                retry_s = min(retry_s * 2, RETRY_S[1])
                continue
            if not alive:
                self._mark_over(action.action_key)
                bound.info("lifecycle action is over: heartbeats stop")
                return
            wait_s, retry_s, last_ok = interval_s, RETRY_S[0], self.clock()

    async def _interval_s(self, action: AsgLifecycleEvent, bound: Any) -> float | None:
        """The hook's heartbeat interval (seconds; ``None``: not ours to beat); a failed read is retried forever."""
        retry_s = RETRY_S[0]
        while True:
            try:
                return await self.lifecycle.interval_s(action)
            except Exception as exc:  # throttled or unreachable after retries (denials are answered None)
                bound.warning("reading the lifecycle hook failed: retrying", error=repr(exc))
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, RETRY_S[1])

    async def _over_while_requeued(self, action: AsgLifecycleEvent, beat: _Beat, limit: float) -> bool:
        """With the action's message back in the queue: wait for a receive, up to ``limit`` or the requeue's margin;
        ``True`` (marked over) when still nobody holds it and the action is over (another replica completed it)."""
        if beat.visible_at is None or self.clock() < beat.visible_at:
            return False
        assert beat.requeued_until is not None
        timeout = min(beat.requeued_until, limit) - self.clock()
        if timeout > 0 and not beat.held.is_set():
            waiters = [asyncio.ensure_future(beat.held.wait()), asyncio.ensure_future(self.sleep(timeout))]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await rest.stop(*waiters)
        if beat.held.is_set() or await self.lifecycle.waiting(action) is not False:
            return False
        self._mark_over(action.action_key)
        return True
