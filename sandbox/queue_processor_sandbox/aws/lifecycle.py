"""The lifecycle-action state machine of the sandbox's Auto Scaling, and the timer thread that drives it.

Semantics of "Amazon EC2 Auto Scaling lifecycle hooks" (EC2 Auto Scaling User Guide) and the API Reference
(``RecordLifecycleActionHeartbeat``, ``CompleteLifecycleAction``):

- :meth:`LifecycleActions.open` opens one action per hook of a transition (an *episode*) and puts the
  instance in ``Terminating:Wait``, ``Pending:Wait`` or ``Warmed:Pending:Wait``.
- An action is addressed by ``LifecycleActionToken`` or ``InstanceId`` (with ``AutoScalingGroupName`` and
  ``LifecycleHookName``); an unknown, completed or timed-out one answers HTTP 400 ``ValidationError`` "No
  active Lifecycle Action found with token <token>" (or "... with instance ID <id>" when addressed by
  instance). A heartbeat restarts the hook's ``HeartbeatTimeout``; no action outlives its global timeout,
  min(48 h, 100 x HeartbeatTimeout). A timed-out action takes the hook's ``DefaultResult``.
- ABANDON also ends the instance's other open actions of the transition (status ``cancelled``). When every
  action of the episode has ended, the instance proceeds with ABANDON when any ended so, else CONTINUE (the
  sandbox moves it: :class:`LifecycleActions` is told through its ``settle`` callback).

Timeouts are simulated seconds, turned into real ones by the sandbox's clock; deadlines are
``time.monotonic()`` readings, watched by one timer thread (:class:`Schedule`). The public records
:class:`LifecycleAction` and :class:`LifecycleCall` are what readers get; :class:`ActionState` is the mutable
state behind an action.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from moto.autoscaling.exceptions import AutoscalingClientError, ValidationError

from queue_processor_sandbox.aws.model import (
    MAX_GLOBAL_TIMEOUT_S,
    ActionStatus,
    LifecycleRequest,
    Result,
    utcnow,
)
from queue_processor_sandbox.clock import SandboxClock

__all__ = ["ActionState", "LifecycleAction", "LifecycleActions", "LifecycleCall", "Schedule"]

#: The package's logger, as before the package was split into modules.
log = logging.getLogger(__package__ or __name__)


# --------------------------------------------------------------------------------------------- public records


@dataclass(frozen=True)
class LifecycleAction:
    """One lifecycle action (one hook for one instance's transition), as it stands when read.

    ``status``: ``open``; ``completed`` by ``CompleteLifecycleAction`` (``result`` is the caller's);
    ``timed-out`` (``result`` is the hook's DefaultResult); ``cancelled`` when another hook of the instance
    ended with ABANDON or the instance went away (``result`` is ``None``). Timeouts are simulated seconds;
    times are wall-clock, aware UTC.
    """

    token: str
    instance_id: str
    asg_name: str
    hook_name: str
    transition: str
    origin: str
    destination: str
    default_result: Result
    heartbeat_timeout_s: float
    global_timeout_s: float
    started_at: datetime
    status: ActionStatus
    result: Result | None
    ended_at: datetime | None
    heartbeats: int


@dataclass(frozen=True, kw_only=True)
class LifecycleCall(LifecycleRequest):
    """One ``RecordLifecycleActionHeartbeat`` or ``CompleteLifecycleAction`` call as the sandbox received it:
    the request (:class:`~.model.LifecycleRequest`), ``time`` it arrived, ``outcome`` = ``"ok"`` or what the caller saw
    (``"ValidationError: <message>"``), and the token of the action it reached (``None`` on error). ``held``,
    for a heartbeat that reached an action: whether a consumer held one of the action's messages (in flight)
    at that moment; ``None`` for every other call."""

    time: datetime
    outcome: str
    action_token: str | None
    held: bool | None = None

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.outcome == "ok"


@dataclass
class ActionState:
    """The mutable state behind :class:`LifecycleAction`; deadlines are ``time.monotonic()`` readings."""

    token: str
    instance_id: str
    asg_name: str
    hook_name: str
    transition: str
    origin: str
    destination: str
    default_result: Result
    heartbeat_timeout_s: float
    global_timeout_s: float
    notification_target_arn: str | None
    notification_metadata: str | None
    started_at: datetime
    deadline: float
    global_deadline: float
    episode: list[ActionState] = field(repr=False, compare=False)
    status: ActionStatus = "open"
    result: Result | None = None
    ended_at: datetime | None = None
    heartbeats: int = 0

    def snapshot(self) -> LifecycleAction:
        """The action as it stands now, frozen."""
        return LifecycleAction(
            token=self.token,
            instance_id=self.instance_id,
            asg_name=self.asg_name,
            hook_name=self.hook_name,
            transition=self.transition,
            origin=self.origin,
            destination=self.destination,
            default_result=self.default_result,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            global_timeout_s=self.global_timeout_s,
            started_at=self.started_at,
            status=self.status,
            result=self.result,
            ended_at=self.ended_at,
            heartbeats=self.heartbeats,
        )


# ------------------------------------------------------------------------------------------------- the timer


class _Timers:
    """One daemon thread that runs callbacks at ``time.monotonic()`` deadlines; :meth:`stop` joins it.
    A callback's exception is logged and kept in ``errors``; it never stops the thread."""

    def __init__(self, errors: list[BaseException]) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="aws-sandbox-timers", daemon=True)
        self.errors = errors

    def start(self) -> None:
        self._thread.start()

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), callback))
            self._cond.notify()

    def clear(self) -> None:
        with self._cond:
            self._heap.clear()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap and self._heap[0][0] <= time.monotonic():
                        break
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, callback = heapq.heappop(self._heap)
            try:
                callback()
            except Exception as exc:  # a broken scenario must not stop the other timers
                log.exception("aws sandbox timer failed")
                self.errors.append(exc)


class Schedule:
    """The sandbox's timer thread (a new one per :meth:`start`, joined by :meth:`stop`) and ``generation``, which
    the sandbox increases on every reset and stop: scheduled work notes the generation when it is scheduled and
    does nothing when, by the time it runs (checked under the sandbox's lock), it has changed. The exceptions
    scheduled work raises are logged and kept in ``errors``."""

    def __init__(self, errors: list[BaseException]) -> None:
        self.generation = 0
        self._errors = errors
        self._timers: _Timers | None = None

    def start(self) -> None:
        """Start a timer thread."""
        self._timers = _Timers(self._errors)
        self._timers.start()

    def stop(self) -> None:
        """Stop the timer thread and join it, dropping what it had pending; nothing when none runs."""
        if self._timers is not None:
            self._timers.stop()
            self._timers = None

    def clear(self) -> None:
        """Drop every pending callback (the thread keeps running)."""
        if self._timers is not None:
            self._timers.clear()

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the timer thread at ``when`` (a ``time.monotonic()`` reading); nothing when no
        timer thread runs."""
        if self._timers is not None:
            self._timers.call_at(when, callback)


# ------------------------------------------------------------------------------------- the state machine


class LifecycleActions:
    """The lifecycle actions of one sandbox, and the record of the heartbeats and completions they received.

    Everything runs under ``lock`` (the sandbox's); ``changed``, a condition on it, is notified whenever an
    action ends or a call is recorded. Durations go through ``clock``; deadlines are armed on ``schedule``.
    ``raise_injected(operation)`` raises the errors set up for an operation (``AutoscalingClientError``),
    ``publish(action, group_arn)`` publishes a newly opened action, ``settle(action, outcome)`` moves the
    instance once the last action of its episode has ended (``outcome``: ABANDON when any ended so, else
    CONTINUE), ``held(token)`` says whether a consumer holds a message that carries the action (recorded with
    each heartbeat; always ``True`` when not given). See the module docstring for the AWS semantics.
    """

    def __init__(
        self,
        lock: threading.RLock,
        changed: threading.Condition,
        clock: SandboxClock,
        schedule: Schedule,
        *,
        raise_injected: Callable[[str], None],
        publish: Callable[[ActionState, str], None],
        settle: Callable[[ActionState, Result], None],
        held: Callable[[str], bool] = lambda token: True,
    ) -> None:
        self._lock = lock
        self._changed = changed
        self._clock = clock
        self._schedule = schedule
        self._raise_injected = raise_injected
        self._publish = publish
        self._settle = settle
        self._held = held
        self._actions: dict[str, ActionState] = {}
        self._open: dict[str, ActionState] = {}
        self._calls: list[LifecycleCall] = []

    # --------------------------------------------------------------------------------------------- record

    def calls(self, instance_id: str | None = None) -> list[LifecycleCall]:
        """Every heartbeat and completion received, in order; only those naming ``instance_id`` (as given or
        through the token) when given."""
        with self._lock:
            if instance_id is None:
                return list(self._calls)
            return [call for call in self._calls if instance_id in self._call_instances(call)]

    def _call_instances(self, call: LifecycleCall) -> set[str | None]:
        """The instances a call names: as given, through the action it reached, through its token."""
        tokens = (call.action_token, call.token)
        return {call.instance_id} | {self._actions[t].instance_id for t in tokens if t in self._actions}

    def actions(
        self, instance_id: str | None = None, *, status: ActionStatus | None = None
    ) -> list[LifecycleAction]:
        """Every lifecycle action opened, oldest first, as it stands (open or final), optionally filtered."""
        with self._lock:
            return [
                a.snapshot()
                for a in self._actions.values()
                if (instance_id is None or a.instance_id == instance_id)
                and (status is None or a.status == status)
            ]

    def action(self, token: str) -> LifecycleAction:
        """The action of ``token``; raises ``KeyError`` when unknown."""
        with self._lock:
            return self._actions[token].snapshot()

    def wait_for_action(self, token: str, timeout_s: float = 10.0) -> LifecycleAction:
        """Wait (real seconds) until the action of ``token`` has ended; its final state. Raises
        ``TimeoutError``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            action = self._actions[token]
            while not self._expire(action):
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"lifecycle action {token} still open after {timeout_s} s")
                self._changed.wait(min(deadline, action.deadline, action.global_deadline) - now + 0.001)
            return action.snapshot()

    def clear(self) -> None:
        """Forget every action and call (the sandbox's reset); called under the lock."""
        self._actions.clear()
        self._open.clear()
        self._calls.clear()

    def close(self) -> None:
        """No action is open any more (the sandbox stopped, its timers are gone); the record stays. Called
        under the lock."""
        self._open.clear()

    # ------------------------------------------------------------------------------------------- transitions

    def open(
        self, state: Any, all_hooks: Iterable[Any], transition: str, origin: str, destination: str
    ) -> list[ActionState]:
        """One action per hook of ``transition``; the instance waits; every action is published.

        ``state`` is moto's record of the instance in its group, ``all_hooks`` moto's lifecycle hooks (of every
        group: those of the instance's group and ``transition`` are used). Returns the episode's actions, none
        when the group has no such hook (the instance is left as it is). Called under the lock."""
        hooks = [
            hook
            for hook in all_hooks
            if hook.auto_scaling_group_name == state.auto_scaling_group_name
            and hook.lifecycle_transition == transition
        ]
        if not hooks:
            return []
        prefix = {"Pending": "Pending", "Warmed:Pending": "Warmed:Pending"}.get(
            state.lifecycle_state, "Terminating"
        )
        state.lifecycle_state = f"{prefix}:Wait"
        now, mono = utcnow(), time.monotonic()
        episode: list[ActionState] = []
        for hook in hooks:
            heartbeat_s = float(hook.heartbeat_timeout)
            global_s = min(MAX_GLOBAL_TIMEOUT_S, 100 * heartbeat_s)
            action = ActionState(
                token=str(uuid.uuid4()),
                instance_id=state.instance.id,
                asg_name=state.auto_scaling_group_name,
                hook_name=hook.name,
                transition=transition,
                origin=origin,
                destination=destination,
                default_result=hook.default_result,
                heartbeat_timeout_s=heartbeat_s,
                global_timeout_s=global_s,
                notification_target_arn=getattr(hook, "notification_target_arn", None),
                notification_metadata=getattr(hook, "notification_metadata", None),
                started_at=now,
                deadline=mono + self._clock.real(heartbeat_s),
                global_deadline=mono + self._clock.real(global_s),
                episode=episode,
            )
            episode.append(action)
            self._actions[action.token] = action
            self._open[action.token] = action
            self._arm(action)
        for action in episode:
            self._publish(action, state.auto_scaling_group.arn)
        return episode

    def cancel(self, instance_id: str) -> None:
        """Cancel the instance's open actions (it went away); its episode does not settle. Called under the
        lock."""
        for action in [a for a in self._open.values() if a.instance_id == instance_id]:
            action.status, action.ended_at = "cancelled", utcnow()
            self._open.pop(action.token, None)

    def _arm(self, action: ActionState) -> None:
        generation, token = self._schedule.generation, action.token
        self._schedule.call_at(
            min(action.deadline, action.global_deadline), lambda: self._on_deadline(token, generation)
        )

    def _on_deadline(self, token: str, generation: int) -> None:
        with self._lock:
            action = self._open.get(token)
            if generation != self._schedule.generation or action is None:
                return
            if not self._expire(action):
                self._arm(action)  # a heartbeat moved the deadline

    def _expire(self, action: ActionState) -> bool:
        """Time the action out when a deadline has passed (whether or not its timer has fired yet)."""
        if action.status == "open" and time.monotonic() >= min(action.deadline, action.global_deadline):
            self._end(action, "timed-out", action.default_result)
            return True
        return action.status != "open"

    def serve(self, request: LifecycleRequest) -> None:
        """Serve a heartbeat or completion, record it, raise moto's ``ValidationError`` as AWS answers (or the
        ``AutoscalingClientError`` injected for the request's operation)."""
        operation, result = request.operation, request.result
        with self._lock:
            matched: ActionState | None = None
            outcome = "InternalFailure"
            held: bool | None = None
            try:
                self._raise_injected(operation)
                if operation == "CompleteLifecycleAction" and result not in ("CONTINUE", "ABANDON"):
                    raise ValidationError("LifecycleActionResult must be CONTINUE or ABANDON")
                matched = self._find_active(
                    request.asg_name, request.hook_name, request.token, request.instance_id
                )
                if operation == "RecordLifecycleActionHeartbeat":
                    matched.heartbeats += 1
                    restarted = time.monotonic() + self._clock.real(matched.heartbeat_timeout_s)
                    matched.deadline = min(restarted, matched.global_deadline)
                    held = self._held(matched.token)
                else:
                    self._end(matched, "completed", "CONTINUE" if result == "CONTINUE" else "ABANDON")
                outcome = "ok"
            except AutoscalingClientError as error:
                outcome = f"{error.code}: {error.message}"
                raise
            finally:
                reached = matched.token if matched is not None and outcome == "ok" else None
                call = LifecycleCall(
                    **vars(request), time=utcnow(), outcome=outcome, action_token=reached, held=held
                )
                self._calls.append(call)
                self._changed.notify_all()

    def _find_active(
        self, asg_name: str, hook_name: str, token: str | None, instance_id: str | None
    ) -> ActionState:
        if not token and not instance_id:
            raise ValidationError("Either LifecycleActionToken or InstanceId must be specified")
        for action in list(self._open.values()):
            if (
                action.asg_name == asg_name
                and action.hook_name == hook_name
                and (not token or action.token == token)
                and (not instance_id or action.instance_id == instance_id)
                and not self._expire(action)
            ):
                return action
        if token:
            raise ValidationError(f"No active Lifecycle Action found with token {token}")
        raise ValidationError(f"No active Lifecycle Action found with instance ID {instance_id}")

    def _end(self, action: ActionState, status: ActionStatus, result: Result | None) -> None:
        """End one action; once its whole episode (every hook of the transition) has ended, the instance
        proceeds with ABANDON when any ended so, else CONTINUE (``settle``)."""
        action.status, action.result, action.ended_at = status, result, utcnow()
        self._open.pop(action.token, None)
        if result == "ABANDON":
            for other in action.episode:
                if other.status == "open":
                    other.status, other.ended_at = "cancelled", action.ended_at
                    self._open.pop(other.token, None)
        self._changed.notify_all()
        if status == "cancelled" or any(other.status == "open" for other in action.episode):
            return
        outcome: Result = (
            "ABANDON" if any(other.result == "ABANDON" for other in action.episode) else "CONTINUE"
        )
        self._settle(action, outcome)
