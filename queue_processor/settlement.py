"""The settlement ledger: a message this replica holds, from its receipt to its settlement.
:class:`InFlightSlots`: at most ``size`` messages held, a slot per message ID with its newest receipt handle (a poll
reserves a :class:`Room`). :class:`Ledger` renews visibility and heartbeats every half visibility timeout (DESIGN.md
rule 5), and deletes or requeues (with a backoff) a message whose operations ended. Errors are logged."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from queue_processor import rest
from queue_processor.aws import call
from queue_processor.config import REQUEUE_MAX_S, default
from queue_processor.events import (
    AsgLifecycleEvent,
    EventStore,
    MessageOutcome,
    NodeOperation,
    SqsMessageRef,
)
from queue_processor.lifecycle import Heartbeats
from queue_processor.observe.metrics import NULL_OBSERVER, Observer
from queue_processor.outcomes import ErrorWhere, MessageFate

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_sqs import SQSClient

log = structlog.get_logger("queue_processor.settlement")

#: How long deletes wait for company before a DeleteMessageBatch call (seconds).
DELETE_WINDOW_S = 0.02

#: Seconds SQS keeps one receipt invisible at most, renewals included ("Amazon SQS visibility timeout").
SQS_HOLD_MAX_S = 43_200.0


def requeue_backoff_s(receive_count: int, base_s: float = default("requeue_backoff_base_sec")) -> int:
    """Visibility timeout (seconds) for a requeued message: ``base_s`` doubling per receive, at most
    :data:`REQUEUE_MAX_S`, ±20 % jitter, at least 1 (SQS counts whole seconds)."""
    base: float = min(base_s * 2.0 ** max(receive_count - 1, 0), REQUEUE_MAX_S)
    return max(1, round(base * random.uniform(0.8, 1.2)))


class Ledger:
    """The messages this replica holds, over ``sqs`` (aiobotocore), their operations in ``store``. Times: seconds."""

    def __init__(
        self,
        sqs: SQSClient,
        store: EventStore,
        heartbeats: Heartbeats,
        *,
        in_flight_budget: int,
        visibility_timeout_s: int,
        poison_visibility_s: int = default("poison_visibility_timeout_sec"),
        requeue_base_s: float = default("requeue_backoff_base_sec"),
        observer: Observer = NULL_OBSERVER,
    ) -> None:
        self.sqs = sqs
        self.store = store
        self.heartbeats = heartbeats
        self.slots = InFlightSlots(in_flight_budget)
        self.visibility_timeout_s = visibility_timeout_s
        self.poison_visibility_s = poison_visibility_s
        self.requeue_base_s = requeue_base_s
        self.observer = observer
        self._extender: asyncio.Task[None] | None = None
        self._pending_deletes: dict[str, list[tuple[SqsMessageRef, asyncio.Future[bool]]]] = {}
        self._delete_flusher: asyncio.Task[None] | None = None
        self._received: dict[str, float] = {}  # message ID → when its newest receipt came (monotonic)
        self._extending: dict[str, asyncio.Future[None]] = {}  # message ID → the renewal carrying it

    def hold_message(self, room: Room, ref: SqsMessageRef) -> None:
        """Hold ``ref``'s message in one of ``room``'s slots, or the one it holds already, with ``ref``'s receipt
        handle. Raises ``RuntimeError`` when ``room`` has no slot left."""
        room.claim(ref)
        self._received[ref.message_id] = time.monotonic()

    def held(self) -> list[SqsMessageRef]:
        """The newest receipt of every message that still has an operation running."""
        refs = (self.slots.ref(message_id) for message_id in self.store.held())
        return [ref for ref in refs if ref is not None]

    def release_slot(self, message_id: str) -> None:
        """Return ``message_id``'s slot unless the store holds the message again (received while settling)."""
        if not self.store.in_flight(message_id):
            self._received.pop(message_id, None)
            self.slots.release(message_id)

    def park_messages(self, message_ids: list[str]) -> None:
        """Keep ``message_ids`` held but give their slots back while their operation waits (DESIGN.md rule 6)."""
        for message_id in message_ids:
            self.slots.park_message(message_id)

    def start(self) -> None:
        """Start renewing the visibility of the messages held."""
        self._extender = rest.spawn(self._extend_loop(), name="visibility-extender")

    async def close(self) -> None:
        """Stop everything the ledger runs, heartbeats included; a delete not sent yet is answered as failed."""
        await rest.stop(self._extender, self._delete_flusher)
        await self.heartbeats.close()

    async def poison(self, ref: SqsMessageRef) -> None:
        """Hide a poison message for POISON_VISIBILITY_TIMEOUT_SEC, never deleting it (the redrive policy acts)."""
        await self._change_visibility(ref, self.poison_visibility_s)

    async def finish(self, operation: NodeOperation, *, succeeded: bool, letting_go: bool = False) -> None:
        """End ``operation``, settle the messages it leaves (errors logged); ``letting_go``: only free their slots."""
        settlement = self.store.finish(operation, succeeded=succeeded)
        if letting_go:
            for message_id, _ in settlement:
                self.release_slot(message_id)
            return
        # Receipts as of now: a receive while the settlement runs updates the slot, not this settlement.
        receipts = [(message_id, self.slots.ref(message_id), outcome) for message_id, outcome in settlement]
        await asyncio.gather(*(self._settle(*receipt, operation) for receipt in receipts))

    async def _settle(
        self, message_id: str, ref: SqsMessageRef | None, outcome: MessageOutcome, operation: NodeOperation
    ) -> None:
        try:
            if ref is None:  # never held: a message holds its slot before the store takes it
                raise RuntimeError(f"no receipt handle held for message {message_id}")
            kinds = ",".join(str(kind) for kind in operation.kinds)
            actions = [
                event
                for event in operation.events
                if isinstance(event, AsgLifecycleEvent)
                and event.message is not None
                and event.message.message_id == message_id
            ]
            renewal = self._extending.get(message_id)
            if renewal is not None:  # a renewal carrying this message is in flight: it must land first
                await asyncio.shield(renewal)
            if outcome is MessageOutcome.DELETE:
                for action in actions:
                    await self.heartbeats.stop(action)
                await self.delete(ref, kinds)
            else:
                backoff = requeue_backoff_s(ref.receive_count, self.requeue_base_s)
                for action in actions:  # beats on until the message is received again (or not)
                    self.heartbeats.requeued(action, backoff, backoff + self.visibility_timeout_s)
                await self._change_visibility(ref, backoff)
                self.observer.message(ref.queue_url, MessageFate.REQUEUED, kinds)
                log.info("requeued", message_id=message_id, visible_in_s=backoff)
        except Exception as exc:
            self.observer.error(ErrorWhere.SETTLE)
            log.error("settlement failed", message_id=message_id, outcome=str(outcome), error=repr(exc))
        finally:
            self.release_slot(message_id)

    async def delete(self, ref: SqsMessageRef, kinds: str) -> None:
        """Delete a message, batched with those of the next :data:`DELETE_WINDOW_S`; failures logged, not raised."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending_deletes.setdefault(ref.queue_url, []).append((ref, future))
        if self._delete_flusher is None or self._delete_flusher.done():
            self._delete_flusher = rest.spawn(self._flush_deletes(), name="delete-batcher")
        if await future:
            self.observer.message(ref.queue_url, MessageFate.DELETED, kinds)

    async def let_go(self, refs: list[SqsMessageRef]) -> None:
        """Shutdown: stop the heartbeats and renewals (one in flight cancelled), wait for the deletes already decided,
        then make ``refs`` (messages of any queues) visible again at once."""
        await self.heartbeats.close()  # nothing beats once this replica lets its messages go
        await rest.stop(self._extender)
        await rest.wait(self._delete_flusher)
        for queue_url in dict.fromkeys(ref.queue_url for ref in refs):
            await self.make_visible(
                queue_url, [ref.receipt_handle for ref in refs if ref.queue_url == queue_url]
            )

    async def make_visible(self, queue_url: str, receipt_handles: list[str]) -> None:
        """Make messages we do not keep visible at once (received too late, or during shutdown)."""
        await self._set_visibility(queue_url, receipt_handles, 0, ErrorWhere.REQUEUE)

    async def _flush_deletes(self) -> None:
        """Send the pending deletes after :data:`DELETE_WINDOW_S`; if this task dies, those not sent count as failed."""
        taken: list[tuple[SqsMessageRef, asyncio.Future[bool]]] = []
        try:
            await asyncio.sleep(DELETE_WINDOW_S)
            while self._pending_deletes:
                queue_url, taken = self._pending_deletes.popitem()
                entries = [{"ReceiptHandle": ref.receipt_handle} for ref, _ in taken]
                refused = await self._batch(
                    self.sqs.delete_message_batch, queue_url, entries, ErrorWhere.DELETE
                )
                for index, (ref, future) in enumerate(taken):
                    entry = refused.get(index)
                    if entry:
                        log.warning(
                            "delete failed",
                            message_id=ref.message_id,
                            code=entry.get("Code"),
                            error=entry.get("Message"),
                        )
                    if not future.done():  # whether SQS deleted it
                        future.set_result(index not in refused)
        finally:  # after a normal end nothing is left; after a death no other batcher takes what is
            left = [*taken, *(item for items in self._pending_deletes.values() for item in items)]
            self._pending_deletes.clear()
            for ref, future in left:
                if future.done():  # answered, or its caller is gone
                    continue
                self.observer.error(ErrorWhere.DELETE)
                log.error("delete not sent: the delete batcher ended", message_id=ref.message_id)
                future.set_result(False)

    async def _batch(
        self,
        method: Callable[..., Awaitable[Any]],
        queue_url: str,
        entries: list[dict[str, Any]],
        where: ErrorWhere,
    ) -> dict[int, Any]:
        """SQS batch calls for ``entries``, 10 a call (each gets its index as ``Id``): the index of each entry not
        done → SQS's failure entry (``None`` when its call failed, logged). Each failure is counted under ``where``."""
        refused: dict[int, Any] = {}
        for start in range(0, len(entries), 10):
            chunk = entries[start : start + 10]
            try:
                answer = await call(
                    method,
                    QueueUrl=queue_url,
                    Entries=[{"Id": str(start + i), **entry} for i, entry in enumerate(chunk)],
                )
            except Exception as exc:
                self.observer.error(where)
                event = "delete failed" if where is ErrorWhere.DELETE else "visibility change failed"
                log.warning(event, queue=queue_url, messages=len(chunk), error=repr(exc))
                refused.update(dict.fromkeys(range(start, start + len(chunk))))
                continue
            for entry in answer.get("Failed") or []:
                self.observer.error(where)
                refused[int(entry["Id"])] = entry
        return refused

    async def _change_visibility(self, ref: SqsMessageRef, seconds: int) -> None:
        try:
            await call(
                self.sqs.change_message_visibility,
                QueueUrl=ref.queue_url,
                ReceiptHandle=ref.receipt_handle,
                VisibilityTimeout=seconds,
            )
        except Exception as exc:
            self.observer.error(ErrorWhere.REQUEUE)
            log.warning("visibility change failed", message_id=ref.message_id, error=repr(exc))

    async def _set_visibility(
        self, queue_url: str, receipt_handles: list[str], seconds: int, where: ErrorWhere
    ) -> set[str]:
        """ChangeMessageVisibilityBatch to ``seconds``; the handles SQS took. Failures logged, not raised."""
        entries = [{"ReceiptHandle": handle, "VisibilityTimeout": seconds} for handle in receipt_handles]
        refused = await self._batch(self.sqs.change_message_visibility_batch, queue_url, entries, where)
        for entry in refused.values():
            if entry:
                log.warning("visibility change failed", queue=queue_url, code=entry.get("Code"))
        return {handle for i, handle in enumerate(receipt_handles) if i not in refused}

    async def _extend_loop(self) -> None:
        period = max(self.visibility_timeout_s / 2, 1.0)
        while True:
            await asyncio.sleep(period)
            await self.renew_held()

    async def renew_held(self) -> None:
        """Renew every held message's visibility (batches of 10), never after its requeue or delete; one held almost
        :data:`SQS_HOLD_MAX_S` (less two visibility timeouts) is made visible instead, before SQS refuses renewal.
        A message's settlement waits for its own batch only."""
        loop = asyncio.get_running_loop()
        refs = self.held()
        renewals = {ref.message_id: loop.create_future() for ref in refs}
        self._extending.update(renewals)
        try:
            for queue_url in dict.fromkeys(ref.queue_url for ref in refs):
                queued = [ref for ref in refs if ref.queue_url == queue_url]
                for start in range(0, len(queued), 10):
                    await self._renew(queue_url, queued[start : start + 10])
                    for ref in queued[start : start + 10]:
                        renewals[ref.message_id].set_result(None)
        finally:
            for message_id, renewal in renewals.items():
                if not renewal.done():
                    renewal.set_result(None)
                if self._extending.get(message_id) is renewal:
                    del self._extending[message_id]

    async def _renew(self, queue_url: str, batch: list[SqsMessageRef]) -> None:
        """Renew the messages of ``batch`` whose operations still run, or make visible those held too long."""
        now, limit = time.monotonic(), SQS_HOLD_MAX_S - 2 * self.visibility_timeout_s
        live = [ref for ref in batch if self.store.in_flight(ref.message_id)]
        expiring = [ref for ref in live if now - self._received.get(ref.message_id, now) >= limit]
        if expiring:
            log.info(
                "messages held for almost SQS's limit made visible again, to be received anew",
                message_ids=[ref.message_id for ref in expiring],
            )
            await self._set_visibility(
                queue_url, [ref.receipt_handle for ref in expiring], 0, ErrorWhere.VISIBILITY
            )
        live = [ref for ref in live if ref not in expiring]
        if not live:
            return
        handles = [ref.receipt_handle for ref in live]
        renewed = await self._set_visibility(
            queue_url, handles, self.visibility_timeout_s, ErrorWhere.VISIBILITY
        )
        for ref in live:  # ours for another visibility timeout: their actions may be beaten
            if ref.receipt_handle in renewed:
                self.heartbeats.hold(self.store.actions_of(ref.message_id))


@dataclass
class Room:
    """Slots reserved for one poll (``size``: 1 to the ``at_most`` asked for; ``unclaimed``: those no message claimed
    yet, returned when the block exits); ``claim`` gives one to a message. Valid inside its ``async with``."""

    slots: InFlightSlots
    size: int
    unclaimed: int

    def claim(self, ref: SqsMessageRef) -> bool:
        """Give a reserved slot to ``ref``'s message; ``False``, taking none, when it holds one already (its receipt
        handle becomes ``ref``'s). Raises ``RuntimeError`` when none is left or the block has exited."""
        held = self.slots._held
        if ref.message_id in held:
            held[ref.message_id] = ref
            return False
        if self.unclaimed <= 0:
            raise RuntimeError("no reserved slot left to claim")
        self.unclaimed -= 1
        held[ref.message_id] = ref
        return True


class InFlightSlots:
    """At most ``size`` (≥ 1) messages held at once; one event loop."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"an in-flight budget of {size} slots: at least 1")
        self.size = size
        self.free = size
        """Slots neither reserved nor held."""
        self._held: dict[str, SqsMessageRef] = {}  # message ID → its newest receipt
        self._parked: set[str] = set()  # held messages that gave their slot back
        self._freed = asyncio.Event()  # set and cleared at once: wakes every poller waiting then
        self.waiting = 0
        """Pollers waiting for a free slot now (liveness: they wait on purpose)."""

    @property
    def held(self) -> int:
        """Slots held by messages (claimed, not released, not parked)."""
        return len(self._held) - len(self._parked)

    @property
    def parked(self) -> int:
        """Messages held without a slot (:meth:`park_message`)."""
        return len(self._parked)

    @asynccontextmanager
    async def reserve_room(self, at_most: int) -> AsyncIterator[Room]:
        """Wait for a free slot, reserve up to ``at_most`` (≥ 1) as a :class:`Room`; those not claimed free on exit."""
        self.waiting += 1
        try:
            while self.free <= 0:
                await self._freed.wait()
        finally:
            self.waiting -= 1
        taken = min(self.free, max(1, at_most))
        self.free -= taken
        room = Room(self, taken, taken)
        try:
            yield room
        finally:
            self._give_back(room.unclaimed)
            room.unclaimed = 0

    def park_message(self, message_id: str) -> None:
        """Keep the message held but give its slot back (its operation waits); no change if it has none (or parked)."""
        if message_id in self._held and message_id not in self._parked:
            self._parked.add(message_id)
            self._give_back(1)

    def ref(self, message_id: str) -> SqsMessageRef | None:
        """The newest receipt of a message holding a slot (``None`` for one that holds none)."""
        return self._held.get(message_id)

    def release(self, message_id: str) -> bool:
        """Return the slot ``message_id`` holds; ``False`` (no change) when it holds none."""
        if self._held.pop(message_id, None) is None:
            return False
        if message_id in self._parked:
            self._parked.discard(message_id)
        else:
            self._give_back(1)
        return True

    def check(self) -> None:
        """Raise ``RuntimeError`` unless 0 ≤ free and free + held ≤ size (a slot counted twice)."""
        if self.free < 0 or self.free + self.held > self.size:
            raise RuntimeError(f"in-flight slots miscounted: {self.free} free, {self.held} held")

    def _give_back(self, count: int) -> None:
        """Free ``count`` slots (:meth:`check`) and wake every poller waiting for one."""
        if count <= 0:
            return
        self.free += count
        self.check()
        self._freed.set()
        self._freed.clear()
