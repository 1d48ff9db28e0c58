"""Webhook notifications (WEBHOOK_URL) as aws-node-termination-handler v1.25.6 sends them: one POST per interruption
after its drain, the template over NTH's ``combinedDrainData`` (``pkg/webhook``; fields in docs/migration.md).
As in NTH, 5 seconds and no retry; a failure is logged and counted, never fails a drain."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import aiohttp
import structlog

from queue_processor.aws import InstanceInfo
from queue_processor.events import Event, EventKind, ScheduledChangeEvent, StateChangeEvent
from queue_processor.kube import KubeClient
from queue_processor.observe.templates import nth_data
from queue_processor.outcomes import KubeError
from queue_processor.watch import RECORD_LABEL
from queue_processor_gotemplate import (
    PROCESS_START,
    GoTime,
    NilMap,
    NilSlice,
    Struct,
    TemplateError,
    parse,
)

log = structlog.get_logger("queue_processor.webhook")

#: Our kind → NTH's ``.Kind`` and the prefix of its EventID (NTH's ``pkg/monitor/sqsevent``).
NTH_KINDS: dict[EventKind, tuple[str, str]] = {
    EventKind.SPOT_INTERRUPTION: ("SPOT_ITN", "spot-itn-event-"),
    EventKind.ASG_TERMINATE_LIFECYCLE: ("ASG_LIFECYCLE", "asg-lifecycle-term-"),
    EventKind.ASG_LAUNCH_LIFECYCLE: ("ASG_LAUNCH_LIFECYCLE", "asg-lifecycle-term-"),
    EventKind.REBALANCE_RECOMMENDATION: ("REBALANCE_RECOMMENDATION", "rebalance-recommendation-event-"),
    EventKind.STATE_CHANGE: ("STATE_CHANGE", "ec2-state-change-event-"),
    EventKind.SCHEDULED_CHANGE: ("SCHEDULED_EVENT", "aws-health-scheduled-change-event-"),
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: (
        "CAPACITY_RESERVATION_INTERRUPTION",
        "capacity-reservation-interruption-event-",
    ),
}

#: The ASG tag EC2 puts on a group's instances (NTH's ``AutoScalingGroupName`` for other kinds).
ASG_TAG = "aws:autoscaling:groupName"


#: NTH's ``.Description`` of each kind (``pkg/monitor/sqsevent``), with its trailing space and newline.
NTH_DESCRIPTIONS: dict[EventKind, str] = {
    EventKind.SPOT_INTERRUPTION: "Spot Interruption notice for instance {instance} was sent at {at} \n",
    EventKind.ASG_TERMINATE_LIFECYCLE: "ASG Lifecycle Termination event received. Instance will be interrupted "
    "at {at} \n",
    EventKind.ASG_LAUNCH_LIFECYCLE: "ASG Lifecycle Launch event received. Instance was started at {at} \n",
    EventKind.REBALANCE_RECOMMENDATION: "Rebalance recommendation event received. Instance {instance} will be "
    "cordoned at {at} \n",
    EventKind.STATE_CHANGE: "EC2 State Change event received. Instance {instance} went into {state} at {at} \n",
    EventKind.SCHEDULED_CHANGE: "AWS Health scheduled change event received. Instance {instance} will be "
    "interrupted at {at} \n",
    EventKind.CAPACITY_RESERVATION_INTERRUPTION: "Capacity Reservation interruption notice for instance {instance} "
    "was sent at {at} \n",
}


def drain_data(
    event: Event,
    *,
    node_labels: Mapping[str, str] | None,
    pods: Sequence[str] | None,
    info: InstanceInfo | None,
    received_wall: datetime | None = None,
    received_monotonic: float | None = None,
) -> Struct:
    """NTH's ``combinedDrainData`` for ``event``; ``node_labels`` / ``pods`` ``None`` render as nil. An AWS Health
    event's ``.StartTime`` is ``received_wall`` (NTH's ``time.Now()``; ``received_monotonic`` gives Go's ``m=+…``)."""
    at = start = GoTime(event.time)
    ident = event.source_id  # EventID: the kind's prefix, then the hex of the EventBridge id (or RequestId)
    if isinstance(event, ScheduledChangeEvent):
        wall = received_wall or datetime.now().astimezone()
        now = received_monotonic if received_monotonic is not None else time.monotonic()
        start, ident = GoTime(wall, monotonic=now - PROCESS_START), event.eventbridge_id
    group = str(getattr(event, "auto_scaling_group_name", info.tags.get(ASG_TAG, "") if info else ""))
    state = event.state if isinstance(event, StateChangeEvent) else ""
    description = NTH_DESCRIPTIONS[event.kind].format(instance=event.instance_id, at=at, state=state)
    return nth_data(
        {
            "EventID": NTH_KINDS[event.kind][1] + (ident or "").encode().hex(),
            "Kind": NTH_KINDS[event.kind][0],
            "Monitor": "SQS_MONITOR",
            "Description": description,
            "AutoScalingGroupName": group,
            "NodeName": info.private_dns_name if info is not None else "",
            "NodeLabels": NilMap() if node_labels is None else dict(node_labels),
            "Pods": NilSlice() if not pods else list(pods),
            "ProviderID": info.provider_id if info is not None and info.availability_zone else "",
            "IsManaged": True,
            "StartTime": start,
            "InProgress": True,
            "InstanceID": event.instance_id,
            "InstanceType": info.instance_type if info is not None else "",
        }
    )


@dataclass(frozen=True)
class NodeFacts:
    """A node's ``labels`` (without :data:`~queue_processor.watch.RECORD_LABEL`) and the names of its
    pods by namespace then name, read before the drain; ``None`` where unreadable (NTH sends nil)."""

    labels: dict[str, str] | None = None
    pods: list[str] | None = None


#: No facts: a dry run, or no webhook to send.
NO_FACTS = NodeFacts()


async def node_facts(kube: KubeClient, node: str) -> NodeFacts:
    """The :class:`NodeFacts` of ``node`` (a node GET and a pod LIST); :data:`NO_FACTS` when unreadable."""
    try:
        found = await kube.get_node(node)
        pods = await kube.pods_on_node(node)
    except KubeError:
        return NO_FACTS
    labels = dict(found["metadata"].get("labels") or {}) if found is not None else None
    if labels is not None:
        labels.pop(RECORD_LABEL, None)
    order = sorted((pod["metadata"].get("namespace", ""), pod["metadata"]["name"]) for pod in pods)
    return NodeFacts(labels, [name for _, name in order])


#: A template parsed once per text (a WEBHOOK_TEMPLATE_FILE is parsed again only when it changed).
_parse = functools.lru_cache(maxsize=8)(parse)


class Webhook:
    """Posts notifications to ``url``; ``failures`` counts those not sent; ``template_file`` is read per request."""

    def __init__(
        self, url: str, *, headers: dict[str, str], template: str, template_file: str = "", proxy: str = ""
    ) -> None:
        self.url = url
        self.headers = headers
        self.template = template
        self.template_file = template_file
        self.proxy = proxy or None
        self.failures = 0
        self.sent = 0

    async def notify_operation(
        self, events: Sequence[Event], info: InstanceInfo, facts: NodeFacts, age_s: float
    ) -> None:
        """One request per event (the first of each kind) of an operation taken up ``age_s`` seconds ago."""
        wall = datetime.now().astimezone() - timedelta(seconds=age_s)
        for event in events:
            data = drain_data(
                event,
                node_labels=facts.labels,
                pods=facts.pods,
                info=info,
                received_wall=wall,
                received_monotonic=time.monotonic() - age_s,
            )
            await self.notify(data)

    async def notify(self, data: Struct) -> None:
        """POST the template rendered over ``data`` (:func:`drain_data`)."""
        source = self.template
        try:
            if self.template_file:
                source = await asyncio.to_thread(Path(self.template_file).read_text, encoding="utf-8")
            body = _parse(source).execute(data)
        except OSError as exc:
            log.warning("webhook template file unreadable: not sent", file=self.template_file, error=str(exc))
            self.failures += 1
            return
        except TemplateError as exc:
            log.warning("webhook template failed to render: not sent", error=str(exc))
            self.failures += 1
            return
        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(
                    self.url, data=body.encode(), headers=self.headers, proxy=self.proxy
                ) as response,
            ):
                if response.status >= 300:
                    raise aiohttp.ClientResponseError(
                        response.request_info, (), status=response.status, message=response.reason or ""
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failures += 1
            log.warning("webhook failed", node=data["NodeName"], event_id=data["EventID"], error=repr(exc))
            return
        self.sent += 1
