"""The SQS side: long-poll receive loops (asking only for what the in-flight budget has room for, DESIGN.md rule 6),
parsing, and new operations handed to the :class:`Handler` in tasks owned here; holding, visibility and settlement
are the ledger's (:mod:`queue_processor.settlement`). No message and no AWS error ends a loop (logged, counted)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from botocore.exceptions import NoCredentialsError

from queue_processor import rest
from queue_processor.aws import call, error_code
from queue_processor.config import default
from queue_processor.events import AdmissionKind, NodeOperation, SqsMessageRef
from queue_processor.handler import Handler
from queue_processor.outcomes import ErrorWhere, MessageFate, PoisonClass, SkipClass
from queue_processor.parse import parse
from queue_processor.settlement import Ledger, Room
from queue_processor.steps import Outcome

if TYPE_CHECKING:  # the stubs are a development dependency
    from types_aiobotocore_sqs.type_defs import MessageTypeDef

log = structlog.get_logger("queue_processor.consumer")


#: SQS error codes that no retry will heal: the queue is not there, or these credentials may not use it.
_REFUSALS = {
    "AWS.SimpleQueueService.NonExistentQueue": "the queue does not exist",
    "QueueDoesNotExist": "the queue does not exist",
    "AccessDenied": "access denied",
    "AccessDeniedException": "access denied",
    "InvalidClientTokenId": "the AWS credentials are not valid",
    "UnrecognizedClientException": "the AWS credentials are not valid",
    "InvalidAccessKeyId": "the AWS credentials are not valid",
    "SignatureDoesNotMatch": "the AWS secret key does not match",
    "ExpiredToken": "the AWS credentials have expired",
    "MissingAuthenticationToken": "no AWS credentials were sent",
}


#: Seconds a shutdown waits for node Lease releases before making their messages visible again.
RELEASES_AT_SHUTDOWN_S = 1.0


class Consumer:
    """Consumes ``queue_urls`` for ``handler`` through ``ledger``: ``loops_per_queue`` polls of ``wait_s`` s each."""

    def __init__(
        self,
        ledger: Ledger,
        handler: Handler,
        *,
        queue_urls: list[str],
        loops_per_queue: int = default("receive_loops_per_queue"),
        wait_s: int = default("receive_wait_time_sec"),
    ) -> None:
        self.ledger = ledger
        self.handler = handler
        self.store = ledger.store
        self.observer = ledger.observer
        self.queue_urls = queue_urls
        self.loops_per_queue = loops_per_queue
        self.wait_s = wait_s
        self.answered_at = 0.0
        """``time.monotonic()`` of the last ReceiveMessage SQS answered (readiness)."""
        self.failed_at = 0.0
        """``time.monotonic()`` of the last ReceiveMessage that failed (readiness)."""
        self.refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """Resolved with one line naming the setting when SQS refuses the very first receives for good."""
        handler.park_messages = ledger.park_messages
        self._operations: set[asyncio.Task[None]] = set()  # operation tasks, settling ones included
        self._loops: list[asyncio.Task[None]] = []
        self._polling: set[asyncio.Task[Any]] = set()  # loops from their poll until its messages are taken
        self._stopping = asyncio.Event()
        self.loop_heartbeat = time.monotonic()
        """``time.monotonic()`` of the last loop iteration (liveness)."""

    def start(self) -> None:
        """Start the receive loops and the ledger's visibility renewals."""
        for url in self.queue_urls:
            for index in range(self.loops_per_queue):
                self._loops.append(rest.spawn(self._receive_loop(url), name=f"receive-{index}-{url}"))
        self.ledger.start()

    def reachable(self) -> bool:
        """Readiness: SQS has answered a ReceiveMessage, and the latest one that ended was answered."""
        return self.answered_at > 0.0 and self.failed_at <= self.answered_at

    def alive(self, max_idle_s: float = 120.0) -> bool:
        """Liveness: every receive loop runs, and one iterated within ``max_idle_s`` seconds or waits for a slot."""
        if not self._loops or any(task.done() for task in self._loops):
            return False
        return time.monotonic() - self.loop_heartbeat < max_idle_s or self.ledger.slots.waiting > 0

    @property
    def tasks(self) -> int:
        """Operation tasks alive, settling ones included."""
        return len(self._operations)

    async def shutdown(self, timeout_s: float | None = None) -> None:
        """EarlyExit for everything: stop receiving, cancel every operation and heartbeat, make held messages and
        those open long polls still bring visible at once. At most ``timeout_s`` seconds (SHUTDOWN_TIMEOUT_SEC;
        ``None``: unbounded), then cancels what is left. Raises nothing."""
        self._stopping.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._shut_down()
        except TimeoutError:
            log.error(
                "shutdown not finished within SHUTDOWN_TIMEOUT_SEC: abandoning what is left",
                timeout_s=timeout_s,
                operations=len(self._operations),
                polls=sum(1 for task in self._loops if not task.done()),
            )
        await rest.stop(*self._loops, *self._operations)
        await self.ledger.close()

    async def _shut_down(self) -> None:
        for task in self._loops:
            if task not in self._polling:  # waiting for an in-flight slot: no poll to let end
                task.cancel()
        held = self.ledger.held()  # no new receipt handle can come in now; operations may end below
        # Settlements under way stop too: every message still held is made visible below anyway.
        await rest.stop(*self._operations)
        leases = self.handler.parts.leases
        if leases is not None:
            # Leases free before their messages are visible to another replica; a hung batch is left to close().
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELEASES_AT_SHUTDOWN_S):
                    await leases.flush()
        await self.ledger.let_go(held)
        # An open poll may take the messages just made visible: its loop makes them visible again (_poll).
        await rest.wait(*self._loops)

    async def _receive_loop(self, queue_url: str) -> None:
        while not self._stopping.is_set():
            self.loop_heartbeat = time.monotonic()
            async with self.ledger.slots.reserve_room(10) as room:
                if self._stopping.is_set():  # room taken while a shutdown began: no new poll
                    return
                retry_in_s = await self._poll(queue_url, room)
            if retry_in_s < 0:  # refused for good
                return
            if retry_in_s:
                await asyncio.sleep(retry_in_s)

    async def _poll(self, queue_url: str, room: Room) -> float:
        """One ReceiveMessage for at most ``room.size`` messages, each taken (:meth:`_take_message`). Returns 0 to poll
        again, the seconds to wait after a failure, or -1 when SQS refuses this controller for good."""
        current = asyncio.current_task()
        assert current is not None
        self._polling.add(current)
        try:
            asked_at = time.monotonic()
            try:
                answer = await call(
                    self.ledger.sqs.receive_message,
                    QueueUrl=queue_url,
                    MaxNumberOfMessages=room.size,
                    WaitTimeSeconds=self.wait_s,
                    VisibilityTimeout=self.ledger.visibility_timeout_s,
                    MessageSystemAttributeNames=["SentTimestamp", "ApproximateReceiveCount"],
                )
            except Exception as exc:
                return self._receive_failed(queue_url, exc)
            self.answered_at = time.monotonic()
            self.observer.receive_answered(queue_url)
            messages = answer.get("Messages") or []
            if messages and time.monotonic() - asked_at > self.wait_s + self.ledger.visibility_timeout_s:
                # Answered after their visibility timeout (paused, stalled): another consumer may hold them.
                log.warning(
                    "messages received too late to be ours: made visible again",
                    messages=len(messages),
                    waited_s=round(time.monotonic() - asked_at, 1),
                )
                await self.ledger.make_visible(queue_url, [m["ReceiptHandle"] for m in messages])
                return 0.0
            failed = 0
            for index, message in enumerate(messages):
                if self._stopping.is_set():  # this replica is letting its messages go: these too
                    log.info(
                        "messages received during shutdown made visible again", messages=len(messages) - index
                    )
                    await self.ledger.make_visible(queue_url, [m["ReceiptHandle"] for m in messages[index:]])
                    return 0.0
                try:
                    failed += not await self._take_message(queue_url, message, room)
                except Exception as exc:  # the loop survives any single message
                    failed += 1
                    self.observer.error(ErrorWhere.HANDLE)
                    log.error("message handling failed", message_id=message.get("MessageId"), error=repr(exc))
                    self.ledger.release_slot(message["MessageId"])
            if messages and failed == len(messages):  # what NTH counts as its monitor's error
                self.observer.error(ErrorWhere.BATCH)
            return 0.0
        finally:
            self._polling.discard(current)

    def _receive_failed(self, queue_url: str, exc: Exception) -> float:
        """Count and log a failed ReceiveMessage: wait 1 s, or -1 when SQS refuses for good (:attr:`refused`)."""
        self.observer.error(ErrorWhere.RECEIVE)
        self.failed_at = time.monotonic()
        code = error_code(exc)
        if self.answered_at or not (code in _REFUSALS or isinstance(exc, NoCredentialsError)):
            log.warning("receive failed", queue=queue_url, error=repr(exc))
            return 1.0
        log.error("the queue refuses this controller: stopping", queue=queue_url, error=repr(exc))
        if not self.refused.done():
            self.refused.set_result(
                f"QUEUE_URL={queue_url}: {_REFUSALS[code]} ({code})"
                if code in _REFUSALS
                else "no AWS credentials found (environment, web identity token, or instance profile)"
            )
        return -1

    async def _take_message(self, queue_url: str, message: MessageTypeDef, room: Room) -> bool:
        """Take one received message; one kept claims a slot of ``room`` until settled. ``False``: poison."""
        attributes = message.get("Attributes") or {}
        sent = attributes.get("SentTimestamp")
        ref = SqsMessageRef(
            queue_url=queue_url,
            message_id=message["MessageId"],
            receipt_handle=message["ReceiptHandle"],
            receive_count=int(attributes.get("ApproximateReceiveCount", 1)),
            sent_timestamp=datetime.fromtimestamp(int(sent) / 1000, UTC) if sent else None,
        )
        bound = log.bind(message_id=ref.message_id)
        result = parse(message.get("Body") or "", ref)
        kinds = ",".join(sorted({str(e.kind) for e in result.events})) or result.outcome
        self.observer.message(queue_url, MessageFate.RECEIVED, kinds)
        reason_class = result.reason_class  # a poison result's PoisonClass, a skip's SkipClass
        if isinstance(reason_class, PoisonClass):
            bound.warning("poison message left for the dead-letter queue", reason=result.reason)
            self.observer.poison(queue_url, reason_class)
            await self.ledger.poison(ref)
            return False
        if isinstance(reason_class, SkipClass):
            bound.info("message skipped", reason=result.reason)
            self.observer.skipped(queue_url, reason_class)
            await self.ledger.delete(ref, kinds)
            return True
        self.ledger.hold_message(room, ref)  # held already (received again): it keeps the slot it has
        for event in result.events:
            admission = self.store.admit(event)
            if admission.kind is AdmissionKind.NEW and admission.operation is not None:
                # Its task first, so that nothing the store took is left unsettled, whatever raises next.
                await self._start(admission.operation)
            if admission.kind is not AdmissionKind.DONE:
                self.handler.received(event)  # heartbeats from first receipt, before any handling
        if not self.store.in_flight(ref.message_id):  # every event repeats one already done
            bound.info("message repeats events already handled: deleted")
            self.ledger.slots.release(ref.message_id)  # before the delete, which may raise or be cancelled
            await self.ledger.delete(ref, kinds)
        self.observer.in_flight(*self.store.counts())
        return True

    async def _start(self, operation: NodeOperation) -> None:
        """Start the task that runs ``operation`` and settles its messages; if that raises, finish it as failed."""
        try:
            name = f"operation-{operation.instance_id}-{operation.mode}"
            task = rest.spawn(self._run(operation), name=name)
            self._operations.add(task)
            task.add_done_callback(functools.partial(self._operation_ended, operation))
        except Exception:
            await self.ledger.finish(operation, succeeded=False)
            raise

    def _operation_ended(self, operation: NodeOperation, task: asyncio.Task[None]) -> None:
        """Drop the ended task; finish as failed an operation a shutdown cancelled before it ran."""
        self._operations.discard(task)
        if self.store.running(operation):
            for message_id, _ in self.store.finish(operation, succeeded=False):
                self.ledger.release_slot(message_id)

    async def _run(self, operation: NodeOperation) -> None:
        succeeded = False
        try:
            succeeded = await self.handler.handle(operation) is Outcome.DONE
        finally:
            # A shutdown makes every held message visible: then only their slots are returned.
            await self.ledger.finish(operation, succeeded=succeeded, letting_go=self._stopping.is_set())
            self.observer.in_flight(*self.store.counts())
