"""Auto Scaling lifecycle actions: heartbeats from first receipt to the end, and CompleteLifecycleAction.

"Amazon EC2 Auto Scaling lifecycle hooks" (EC2 Auto Scaling User Guide) and the API Reference of
``RecordLifecycleActionHeartbeat`` / ``CompleteLifecycleAction`` / ``DescribeLifecycleHooks``:

- a heartbeat restarts the hook's HeartbeatTimeout; the interval is HEARTBEAT_INTERVAL, or (-1) half the
  hook's HeartbeatTimeout, read once per hook and cached; 0 turns heartbeats off. A hook that cannot be read
  (``AccessDenied``: NTH's documented IAM policy has no ``autoscaling:DescribeLifecycleHooks``) gets no
  heartbeats, with one warning per hook naming the permission or HEARTBEAT_INTERVAL as the way out;
- :class:`Heartbeats` keeps one heartbeat task per action, keyed by :class:`~queue_processor.events.ActionKey`,
  from the moment the action's message is first received (:meth:`Heartbeats.start`, synchronous: it never
  delays a cordon) until the action is completed (:meth:`Heartbeats.complete`) or over (AWS answers
  ``ValidationError: No active Lifecycle Action found``), HEARTBEAT_UNTIL has passed, or the controller shuts
  down (:meth:`Heartbeats.close`). A requeued action keeps its heartbeat while its message waits out the
  requeue backoff (:meth:`Heartbeats.requeued`): a hook whose timeout is shorter than the backoff must not
  expire between two attempts. Once the backoff is over the message is back in the queue and nobody holds the
  action: a beat that falls due then waits for a receive to take the message again, at most a quarter
  interval past its due time (:data:`DEFER_MAX`: the HeartbeatTimeout keeps most of its slack). If the
  message is not received again within the requeue's margin, the heartbeat stops;
- a failed heartbeat is retried within seconds (:data:`RETRY_S`), with a warning, never a whole interval
  later (the next beat would land after the HeartbeatTimeout);
- :meth:`Lifecycle.complete` answers the :class:`~queue_processor.outcomes.LifecycleResult` it
  got: ``continue`` / ``abandon``, or, for that same ValidationError, ``no-active-action`` (terminal: the
  action was completed, abandoned or timed out already).

An action is addressed by its token, or by instance ID when the message carried none.
"""

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

from queue_processor import tasks
from queue_processor.aws import call, error_code, is_no_active_action, is_retryable
from queue_processor.config import Settings
from queue_processor.events import ActionKey
from queue_processor.kinds import AsgLifecycleEvent
from queue_processor.observe.observer import NULL_OBSERVER, Observer
from queue_processor.outcomes import HeartbeatResult, LifecycleResult

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_autoscaling import AutoScalingClient

__all__ = ["DEFER_MAX", "MAX_HEARTBEAT_UNTIL_S", "RETRY_S", "Heartbeats", "Lifecycle", "action_params"]

log = structlog.get_logger("queue_processor.lifecycle")

#: The longest an instance can be kept in a wait state: 48 hours (or 100 x HeartbeatTimeout if smaller).
MAX_HEARTBEAT_UNTIL_S = 172_800.0

#: Seconds before a failed heartbeat (or hook read) is tried again: doubling from the first to the second.
RETRY_S = (2.0, 10.0)

#: How long a beat due while its requeued message sits in the queue, held by nobody, may wait for a receive to
#: take it again: this fraction of the interval past its due time (the automatic interval, half the
#: HeartbeatTimeout, then leaves three eighths of the timeout as slack for a slow or retried beat).
DEFER_MAX = 0.25


def action_params(action: AsgLifecycleEvent) -> dict[str, str]:
    """The parameters that address ``action`` in the lifecycle API calls."""
    params = {
        "AutoScalingGroupName": action.auto_scaling_group_name,
        "LifecycleHookName": action.lifecycle_hook_name,
    }
    if action.lifecycle_action_token:
        params["LifecycleActionToken"] = action.lifecycle_action_token
    else:
        params["InstanceId"] = action.instance_id
    return params


class Lifecycle:
    """Single lifecycle API calls through an aiobotocore Auto Scaling client. ``observer`` is told every
    heartbeat's and completion's result (and ``hook-unreadable`` when DescribeLifecycleHooks is refused)."""

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
        """How many instances the Auto Scaling group ``group`` has (DescribeAutoScalingGroups), read at most
        once every ``ttl_s`` seconds and by one caller at a time (the others wait for its answer); when a
        read fails (not found, denied, AWS unreachable after retries: logged), the last size read, else
        ``None``. Raises nothing but ``CancelledError``."""
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
        """The hook's HeartbeatTimeout (seconds), read once with DescribeLifecycleHooks and cached; ``None``
        when the hook is not found or may not be read (a non-retryable error such as ``AccessDenied``: logged
        once as a warning, cached). Raises the AWS error when retries of a retryable one are exhausted (not
        cached: the caller tries again). ``quiet``: a hook that may not be read is neither logged nor counted
        (the caller does not need it for heartbeats)."""
        timeout = (await self._hook(group, hook, quiet=quiet) or {}).get("HeartbeatTimeout")
        return float(timeout) if timeout is not None else None

    async def default_result(self, group: str, hook: str) -> Literal["CONTINUE", "ABANDON"]:
        """The hook's ``DefaultResult``: what Auto Scaling does when the action times out, and what a launch
        whose node never turned Ready is completed with (DESIGN.md rule 9). ``ABANDON`` when the hook cannot
        be read (not found, denied, or AWS unreachable after retries): an instance nobody can vouch for is
        replaced. Raises nothing but ``CancelledError``."""
        try:
            described = await self._hook(group, hook, quiet=True)
        except ClientError:
            return "ABANDON"
        result = (described or {}).get("DefaultResult")
        return "CONTINUE" if result == "CONTINUE" else "ABANDON"

    async def _hook(self, group: str, hook: str, *, quiet: bool) -> dict[str, Any] | None:
        """The hook as DescribeLifecycleHooks describes it, read once and cached (see :meth:`hook_timeout_s`)."""
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
        """Seconds between heartbeats for ``action``, or ``None`` for none (HEARTBEAT_INTERVAL=0, or automatic
        with the hook unknown or unreadable). Raises a retryable AWS error whose retries are exhausted."""
        configured = self.settings.heartbeat_interval
        if configured == 0:
            return None
        if configured > 0:
            await self._check_interval(action, float(configured))
            return float(configured)
        timeout = await self.hook_timeout_s(action.auto_scaling_group_name, action.lifecycle_hook_name)
        return timeout / 2 if timeout else None

    async def _check_interval(self, action: AsgLifecycleEvent, interval: float) -> None:
        """Warn once per hook when HEARTBEAT_INTERVAL is not shorter than its HeartbeatTimeout: its actions
        would time out between two heartbeats (NTH warns too). A hook that cannot be read is not checked."""
        key = (action.auto_scaling_group_name, action.lifecycle_hook_name)
        if key in self._checked:
            return
        self._checked.add(key)
        try:
            timeout = await self.hook_timeout_s(*key, quiet=True)
        except ClientError:
            return
        if timeout is not None and interval >= timeout:
            log.warning(
                "HEARTBEAT_INTERVAL is not shorter than the lifecycle hook's HeartbeatTimeout: its actions time "
                "out between heartbeats; lower HEARTBEAT_INTERVAL or set it to -1 (automatic)",
                group=key[0],
                hook=key[1],
                heartbeat_interval_s=interval,
                heartbeat_timeout_s=timeout,
            )

    def until_s(self) -> float:
        """How long heartbeats may go on for one action (HEARTBEAT_UNTIL, or AWS's 48 h limit)."""
        until = self.settings.heartbeat_until
        return float(until) if until > 0 else MAX_HEARTBEAT_UNTIL_S

    async def waiting(self, action: AsgLifecycleEvent) -> bool | None:
        """Whether the action's instance still waits in a lifecycle hook's wait state for its transition
        (DescribeAutoScalingInstances ``LifecycleState``: ``Pending:Wait`` or ``Warmed:Pending:Wait`` for a
        launch, ``Terminating:Wait`` or ``Warmed:Terminating:Wait`` for a termination): ``False`` when it does
        not (another consumer completed the action, it timed out, or the instance left its group), ``None``
        when Auto Scaling cannot say (refused, unreachable after retries: logged once per kind of error).
        Raises nothing but ``CancelledError``."""
        try:
            answer = await call(
                self.autoscaling.describe_auto_scaling_instances, InstanceIds=[action.instance_id]
            )
        except asyncio.CancelledError:
            raise
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
        """One RecordLifecycleActionHeartbeat: ``True`` when recorded, ``False`` when the action is over
        (``No active Lifecycle Action``). Raises other AWS errors after retries."""
        try:
            await call(self.autoscaling.record_lifecycle_action_heartbeat, **action_params(action))
        except asyncio.CancelledError:
            raise
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
        """CompleteLifecycleAction with ``result`` (``LifecycleActionResult``): ``continue`` / ``abandon``
        when AWS took it, ``no-active-action`` when the action was over already. Raises other AWS errors
        after retries."""
        try:
            await call(
                self.autoscaling.complete_lifecycle_action,
                LifecycleActionResult=result,
                **action_params(action),
            )
        except asyncio.CancelledError:
            raise
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
    held: asyncio.Event  # set while a receive of ours holds the action's message
    requeued_until: float | None = None  # clock reading; None while a receive of ours holds the action
    visible_at: float | None = None  # clock reading: when the requeued message is back in the queue
    held_until: float | None = None  # clock reading: when our hold of the message lapses; None: never
    confirmed: asyncio.Event = field(
        default_factory=asyncio.Event
    )  # set when a receive or renewal confirms it


class Heartbeats:
    """Every lifecycle action's heartbeat task, from first receipt until it is completed or over (see the
    module docstring). Not thread-safe: one asyncio loop owns it. ``clock`` returns monotonic seconds and
    ``sleep`` waits that many of them (tests give both a fake time)."""

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
        """Heartbeat tasks alive."""
        return len(self._beats)

    def beating(self, action: AsgLifecycleEvent) -> bool:
        """Whether ``action`` has a heartbeat task."""
        return action.action_key in self._beats

    def start(self, action: AsgLifecycleEvent) -> None:
        """Heartbeat ``action`` from now on (idempotent; an action requeued earlier is held again). Never
        waits: the hook is read inside the task."""
        key = action.action_key
        beat = self._beats.get(key)
        if beat is not None:
            beat.requeued_until = beat.visible_at = None
            beat.held.set()
            self._confirm(beat)
            return
        if key in self._over or key in self._completing:
            return
        name = f"heartbeat-{action.instance_id}-{action.lifecycle_hook_name}"
        task = tasks.spawn(self._run(action), name=name)
        self._beats[key] = _Beat(action, task, asyncio.Event())
        self._beats[key].held.set()
        self._confirm(self._beats[key])
        task.add_done_callback(functools.partial(self._forget, key))

    def hold(self, keys: Iterable[ActionKey]) -> None:
        """The messages carrying the actions of ``keys`` are ours for another ``hold_s`` seconds (their
        visibility was just renewed): their heartbeats may go on."""
        for key in keys:
            beat = self._beats.get(key)
            if beat is not None:
                self._confirm(beat)

    def _confirm(self, beat: _Beat) -> None:
        beat.held_until = None if self.hold_s is None else self.clock() + self.hold_s
        beat.confirmed.set()

    def requeued(self, action: AsgLifecycleEvent, visible_in_s: float, for_s: float) -> None:
        """The action's message was requeued and is back in the queue in ``visible_in_s`` seconds (its
        backoff): beat on until then; after it, only a beat the HeartbeatTimeout needs before a receive takes
        the message again; stop ``for_s`` seconds from now (the backoff plus a margin for the receive) unless
        :meth:`start` is called again."""
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
            await tasks.stop(beat.task)

    async def complete(
        self, action: AsgLifecycleEvent, result: Literal["CONTINUE", "ABANDON"] = "CONTINUE"
    ) -> LifecycleResult:
        """Complete ``action`` with its heartbeat stopped first (no beat after the end); when completion
        fails, the heartbeat starts again and the error is raised. Returns what
        :meth:`Lifecycle.complete` returns. While the completion is on its way the action is not heartbeated
        again (a copy of its message received meanwhile starts nothing)."""
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
        await tasks.stop(*(beat.task for beat in beats))

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
        retry_s = RETRY_S[0]
        while True:  # the interval: a throttled hook read is tried again, never given up
            try:
                interval_s = await self.lifecycle.interval_s(action)
                break
            except Exception as exc:  # throttled or unreachable after retries (denials are answered None)
                bound.warning("reading the lifecycle hook failed: retrying", error=repr(exc))
                await asyncio.sleep(retry_s)
                retry_s = min(retry_s * 2, RETRY_S[1])
        if interval_s is None:
            return
        deadline = self.clock() + self.lifecycle.until_s()
        # The hook's timer runs from the action's start (or from a heartbeat this task cannot know of): the
        # first beat comes ``interval_s`` after the action started, at once for an action older than that (a
        # message redelivered after a failed attempt and its backoff, or one that waited in the queue).
        age_s = (datetime.now(UTC) - action.time).total_seconds()
        wait_s = min(interval_s, max(interval_s - age_s, 0.0))
        if wait_s <= 0 and await self.lifecycle.waiting(action) is False:
            # Due at once: a message received again (after a restart, a requeue, another replica's hold) whose
            # action may be over already; a beat would only be refused.
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
            if beat is not None and beat.visible_at is not None and self.clock() >= beat.visible_at:
                # Back in the queue, held by nobody: wait for a receive to take it again (it comes within a
                # long poll), no longer than a quarter interval past the due time nor the requeue's margin.
                assert beat.requeued_until is not None
                limit = last_ok + (1.0 + DEFER_MAX) * interval_s
                await self._until_held(beat, min(beat.requeued_until, limit))
            if beat is not None and beat.requeued_until is not None and self.clock() >= beat.requeued_until:
                bound.info("requeued lifecycle action not received again: heartbeats stop")
                return
            if self.clock() >= deadline:
                continue
            held_until = beat.held_until if beat is not None and beat.visible_at is None else None
            if beat is not None and held_until is not None and self.clock() > held_until:
                # Our hold of the action's message lapsed (this process was paused, or its renewals failed for a
                # visibility timeout): another consumer may hold it now, and the action may be over. No heartbeat
                # until a receive or a renewal says it is ours again.
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

    async def _until_held(self, beat: _Beat, until: float) -> None:
        """Wait until a receive holds the beat's message again or the clock reads ``until``."""
        timeout = until - self.clock()
        if timeout <= 0 or beat.held.is_set():
            return
        waiters = [asyncio.ensure_future(beat.held.wait()), asyncio.ensure_future(self.sleep(timeout))]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await tasks.stop(*waiters)
