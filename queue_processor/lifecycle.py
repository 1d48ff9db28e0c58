"""Auto Scaling lifecycle actions: the heartbeat task and CompleteLifecycleAction.

"Amazon EC2 Auto Scaling lifecycle hooks" (EC2 Auto Scaling User Guide) and the API Reference of
``RecordLifecycleActionHeartbeat`` / ``CompleteLifecycleAction`` / ``DescribeLifecycleHooks``:

- a heartbeat restarts the hook's HeartbeatTimeout; the interval is HEARTBEAT_INTERVAL, or (-1) half the
  hook's HeartbeatTimeout, read once per hook and cached; 0 turns heartbeats off;
- :meth:`Lifecycle.heartbeat` runs until it is cancelled (its owner cancels and awaits it when the action's
  handling ends, whatever the outcome: DESIGN.md rule 3), until HEARTBEAT_UNTIL, or until AWS answers
  ``ValidationError: No active Lifecycle Action found`` (the action is over: nothing left to extend);
- :meth:`Lifecycle.complete` answers ``"completed"`` or, for that same ValidationError, ``"no-active-action"``
  (terminal: the action was completed, abandoned or timed out already).

An action is addressed by its token, or by instance ID when the message carried none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from queue_processor.aws import call, is_no_active_action
from queue_processor.config import Settings
from queue_processor.events import AsgLifecycleEvent

__all__ = ["MAX_HEARTBEAT_UNTIL_S", "Lifecycle"]

#: The longest an instance can be kept in a wait state: 48 hours (or 100 x HeartbeatTimeout if smaller).
MAX_HEARTBEAT_UNTIL_S = 172_800.0


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
    """Heartbeats and completions through an aiobotocore Auto Scaling client. ``on_result(what, result)`` is
    called for metrics: ``("heartbeat", "ok"|"error"|"validation-error")`` and ``("complete",
    "continue"|"abandon"|"no-active-action"|"error")``. ``clock`` returns seconds."""

    def __init__(
        self,
        autoscaling: Any,
        settings: Settings,
        *,
        on_result: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.autoscaling = autoscaling
        self.settings = settings
        self.on_result = on_result or (lambda what, result: None)
        self.clock = clock
        self._timeouts: dict[tuple[str, str], float | None] = {}
        self.heartbeats_sent = 0

    async def hook_timeout_s(self, group: str, hook: str) -> float | None:
        """The hook's HeartbeatTimeout (seconds), read once with DescribeLifecycleHooks and cached; ``None``
        when the hook is not found."""
        key = (group, hook)
        if key not in self._timeouts:
            answer = await call(
                self.autoscaling.describe_lifecycle_hooks,
                AutoScalingGroupName=group,
                LifecycleHookNames=[hook],
            )
            hooks = answer.get("LifecycleHooks") or []
            self._timeouts[key] = float(hooks[0]["HeartbeatTimeout"]) if hooks else None
        return self._timeouts[key]

    async def interval_s(self, action: AsgLifecycleEvent) -> float | None:
        """Seconds between heartbeats for ``action``, or ``None`` for none (HEARTBEAT_INTERVAL=0, or automatic
        with the hook unknown)."""
        configured = self.settings.heartbeat_interval
        if configured == 0:
            return None
        if configured > 0:
            return float(configured)
        timeout = await self.hook_timeout_s(action.auto_scaling_group_name, action.lifecycle_hook_name)
        return timeout / 2 if timeout else None

    def until_s(self) -> float:
        """How long heartbeats may go on for one action (HEARTBEAT_UNTIL, or AWS's 48 h limit)."""
        until = self.settings.heartbeat_until
        return float(until) if until > 0 else MAX_HEARTBEAT_UNTIL_S

    async def heartbeat(self, action: AsgLifecycleEvent, interval_s: float) -> None:
        """Send a heartbeat every ``interval_s`` seconds until cancelled, until :meth:`until_s` has passed, or
        until AWS says the action is over; the first one ``interval_s`` after the action's ``time`` (at once
        when that has passed). Other errors are counted and the next beat is tried."""
        deadline = self.clock() + self.until_s()
        params = action_params(action)
        # The hook's timer runs from the action's start (or from a heartbeat this task cannot know of): the
        # first beat comes ``interval_s`` after the action started, at once for an action older than that (a
        # message redelivered after a failed attempt and its backoff, or one that waited in the queue).
        age_s = (datetime.now(UTC) - action.time).total_seconds()
        wait_s = min(interval_s, max(interval_s - age_s, 0.0))
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                return
            await asyncio.sleep(min(wait_s, remaining))
            wait_s = interval_s
            if self.clock() >= deadline:
                return
            try:
                await call(self.autoscaling.record_lifecycle_action_heartbeat, **params)
            except ClientError as exc:
                if is_no_active_action(exc):
                    self.on_result("heartbeat", "validation-error")
                    return
                self.on_result("heartbeat", "error")
                continue
            self.heartbeats_sent += 1
            self.on_result("heartbeat", "ok")

    async def complete(self, action: AsgLifecycleEvent, result: str = "CONTINUE") -> str:
        """CompleteLifecycleAction with ``result`` (CONTINUE or ABANDON); ``"completed"``, or
        ``"no-active-action"`` when the action was over already. Raises other AWS errors after retries."""
        try:
            await call(
                self.autoscaling.complete_lifecycle_action,
                LifecycleActionResult=result,
                **action_params(action),
            )
        except ClientError as exc:
            if is_no_active_action(exc):
                self.on_result("complete", "no-active-action")
                return "no-active-action"
            self.on_result("complete", "error")
            raise
        self.on_result("complete", result.lower())
        return "completed"
