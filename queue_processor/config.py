"""Settings: environment variables (and CLI flags), validated once at start-up; times in seconds. An empty
variable counts as unset. Names and defaults follow aws-node-termination-handler (NTH); each field's ``nth`` note
states a difference (``docs/configuration.md``, from :func:`queue_processor.cli.configuration_markdown`)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from queue_processor.observe.templates import DEFAULT_WEBHOOK_TEMPLATE, check_template
from queue_processor_gotemplate import TemplateError

#: The longest requeue backoff (seconds): SQS's 15-minute limit on a message's hidden delay kept as a bound.
REQUEUE_MAX_S = 900


def parse_annotations(text: str) -> dict[str, str]:
    """Comma-separated ``key=value`` pairs (NTH's format); ``ValueError`` names a pair that is not one."""
    annotations: dict[str, str] = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{pair!r} is not key=value")
        annotations[key.strip()] = value.strip()
    return annotations


def region_from_queue_url(url: str) -> str | None:
    """The AWS region in an SQS queue URL, or ``None`` (a local endpoint). Hosts: sqs.<region>.amazonaws.com[.cn],
    <region>.queue.amazonaws.com (legacy), and VPC endpoint host names."""
    match = re.match(
        r"^https?://(?:[^/]*?\.)?(?:sqs[.-])?(?P<region>[a-z]{2}(?:-gov|-iso[a-z]*)?-[a-z]+-\d+)\."
        r"(?:queue\.)?(?:vpce\.)?amazonaws\.com(?:\.cn)?(?::\d+)?/",
        url,
    )
    return match.group("region") if match else None


def _field(
    default: Any,
    description: str,
    *,
    nth: str = "same",
    unit: str = "",
    aliases: tuple[str, ...] = (),
    secret: bool = False,
    bounds: tuple[float, float] | None = None,
    **kwargs: Any,
) -> Any:
    """A field with the notes the docs and the CLI read; ``bounds``: the inclusive (least, most) value."""
    extra: dict[str, Any] = {"nth": nth, "unit": unit, "aliases": list(aliases), "secret": secret}
    if bounds is not None:
        kwargs["ge"], kwargs["le"] = bounds
    if aliases:
        kwargs["validation_alias"] = AliasChoices(*kwargs.pop("primary", ()), *aliases)
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class Settings(BaseSettings):
    """Every setting; a bad value raises pydantic's ``ValidationError`` (made one line by ``cli.load_settings``)."""

    model_config = SettingsConfigDict(
        case_sensitive=False,
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,  # KUBE_API_QPS=inf is a mistake, not a setting
    )

    # --- the queue
    queue_url: str = _field(
        "",
        "URL of the SQS queue that EventBridge rules and lifecycle hooks send interruption messages to. A "
        "standard queue: a FIFO queue (name ending in .fifo) is refused, since one held or requeued message would "
        "hold back every later message of its group.",
        nth="same; required (here or in QUEUE_URLS); NTH does not check the queue type",
    )
    queue_urls: Annotated[list[str], NoDecode] = _field(
        [],
        "More queues to consume, comma-separated, each with its own receive loops. They must be in the "
        "region of AWS_REGION and the account of QUEUE_URL: the EC2 and Auto Scaling calls for their "
        "instances go to that one region and account (run one controller per region or account).",
        nth="none: NTH consumes one queue",
    )
    aws_region: str = _field(
        "",
        "AWS region of the queue and of the EC2 and Auto Scaling calls. Default: the region in QUEUE_URL.",
        nth="same; in queue-processor mode NTH also takes it from QUEUE_URL (the first region ID of the AWS "
        "SDK's partitions that the URL contains)",
    )
    aws_endpoint: str = _field(
        "",
        "Endpoint URL for every AWS call, for testing (the sandbox) or private endpoints. Default: AWS's.",
    )
    sqs_msg_visibility_timeout_sec: int = _field(
        60,
        "Visibility timeout given to a received message; renewed while the message is handled, so it only "
        "bounds how long a message stays hidden after a crash.",
        nth="same name; NTH (v1.25.6) accepts 1-119, defaults to 20 and never renews it",
        unit="seconds",
        bounds=(10, 43200),
    )
    receive_loops_per_queue: int = _field(
        2,
        "Concurrent long-poll ReceiveMessage loops per queue (10 messages per call).",
        nth="none",
        bounds=(1, 64),
    )
    receive_wait_time_sec: int = _field(
        20,
        "Long-poll wait of each ReceiveMessage call (SQS WaitTimeSeconds). On shutdown the open polls are "
        "left to end by themselves (at most this long) and what they bring back is made visible at once: a "
        "poll abandoned by the client may still take messages on the server and hide them.",
        nth="none: NTH polls with a 20 s wait",
        unit="seconds",
        bounds=(1, 20),
    )
    shutdown_timeout_sec: float = _field(
        25.0,
        "The longest a shutdown (SIGTERM, SIGINT) may take: EarlyExit for every operation, messages in "
        "flight made visible again, open polls ended. Whatever is still running then is abandoned and the "
        "process exits. Keep it below the pod's terminationGracePeriodSeconds (the chart's is 30 s).",
        nth="none: NTH has no bound on its shutdown",
        unit="seconds",
        gt=0,
        le=3600,
    )
    in_flight_budget: int = _field(
        2000,
        "Most messages being handled at once; receiving pauses only when this many are in flight.",
        nth="none: NTH's WORKERS (default 10) bounded whole events; not needed",
        unit="messages",
        bounds=(1, 100_000),
    )
    poison_visibility_timeout_sec: int = _field(
        3600,
        "How long a message that cannot be parsed stays hidden before SQS offers it again, on its way to the "
        "dead-letter queue (never deleted; the queue's maxReceiveCount decides when it moves).",
        nth="none: NTH does not delete them either, but offers them again every SQS_MSG_VISIBILITY_TIMEOUT_SEC "
        "(20 s by default) until the redrive policy moves them",
        unit="seconds",
        bounds=(0, 43200),
    )
    requeue_backoff_base_sec: float = _field(
        10.0,
        f"First backoff of a requeued message (EarlyExit); it doubles with each receive, up to "
        f"{REQUEUE_MAX_S} s, with 20 % jitter.",
        nth="none: NTH leaves a failed message to SQS_MSG_VISIBILITY_TIMEOUT_SEC (20 s by default)",
        unit="seconds",
        bounds=(0, REQUEUE_MAX_S),
    )
    delete_sqs_msg_if_node_not_found: bool = _field(
        False,
        "Delete a message whose instance has no node in the cluster at once, its lifecycle actions completed. "
        "Otherwise it is requeued while a node may still register, until the instance has run for "
        "LAUNCH_READY_TIMEOUT_SEC; then it is deleted and its actions completed the same way (nothing to drain).",
        nth="same name; NTH requeues until the dead-letter queue when it is false",
    )
    # --- which nodes
    check_tag_before_draining: bool = _field(
        True,
        "Act only on instances that carry MANAGED_TAG.",
        aliases=("CHECK_ASG_TAG_BEFORE_DRAINING",),
        primary=("check_tag_before_draining",),
    )
    managed_tag: str = _field(
        "aws-node-termination-handler/managed",
        "The tag key that marks an instance as managed by this controller.",
        aliases=("MANAGED_ASG_TAG",),
        primary=("managed_tag",),
    )
    managed_tag_value: str = _field(
        "",
        "When set, the managed tag must also have this value (so several clusters can share an account).",
        nth="none: NTH checks the key only",
    )
    use_provider_id: bool = _field(
        False,
        "Find the node by spec.providerID (aws:///<az>/<instance-id>) instead of by the instance's private DNS "
        "name.",
    )
    # --- what is done to a node
    dry_run: bool = _field(
        False,
        "Log what would be done and change nothing in Kubernetes (no cordon, taint, label, eviction, Lease or "
        "Event), but still complete lifecycle actions (CONTINUE; a launch once its node is Ready) and send "
        "the webhook, so that a dry run never holds an instance until its hook times out. No heartbeats.",
        nth="same; NTH also records its Kubernetes Events and sends heartbeats in a dry run",
    )
    cordon_only: bool = _field(False, "Cordon nodes but do not drain them.")
    taint_node: bool = _field(
        False, "Taint the node with the event kind's NTH taint key (value: the event ID)."
    )
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = _field(
        "NoSchedule",
        "Effect of the taint TAINT_NODE adds.",
        nth="same; NTH falls back to NoSchedule on an unknown value, here start-up fails",
    )
    enable_out_of_service_taint: bool = _field(
        False,
        "After a successful drain, add node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (not with "
        "CORDON_ONLY).",
    )
    exclude_from_load_balancers: bool = _field(
        False,
        "Label the node node.kubernetes.io/exclude-from-external-load-balancers before draining it.",
    )
    delete_local_data: bool = _field(True, "Evict pods that use emptyDir volumes (their data is lost).")
    ignore_daemon_sets: bool = _field(
        True, "Leave DaemonSet-managed pods on the node (when false, a node with such pods is not drained)."
    )
    pod_termination_grace_period: int = _field(
        -1,
        "Grace period given to each evicted pod; -1 uses each pod's own terminationGracePeriodSeconds.",
        unit="seconds",
        aliases=("GRACE_PERIOD",),
        primary=("pod_termination_grace_period",),
        ge=-1,
    )
    node_termination_grace_period: int = _field(
        120,
        "Longest a node's drain may take before the event is requeued (a Spot drain also stops at the "
        "interruption time).",
        unit="seconds",
        ge=1,
    )
    drain_order: Literal["waves", "all-at-once"] = _field(
        "waves",
        "Order of a drain's evictions. waves: ordinary pods first, then critical pods (priority class "
        "system-cluster-critical or system-node-critical, or spec.priority at least DRAIN_CRITICAL_PRIORITY) "
        "once the ordinary ones are gone, or once only the time the critical ones need is left, so that log "
        "shippers, meshes and storage daemons outlive the pods that use them. all-at-once: every pod at once, "
        "as kubectl drain.",
        nth="none: NTH evicts every pod at once",
    )
    drain_critical_priority: int = _field(
        2_000_000_000,
        "spec.priority from which a pod counts as critical for DRAIN_ORDER=waves (system-cluster-critical is "
        "2000000000; lower it to move your own high PriorityClasses into the last wave).",
        nth="none",
        bounds=(-2_147_483_648, 2_147_483_647),
    )
    grace_deadline_margin: float = _field(
        10.0,
        "When a notice gives the instance an end (Spot, Capacity Reservation, an AWS Health scheduled change), "
        "each evicted pod's grace period is cut to end this long before it (at least 1 s); -1 = never cut.",
        nth="none: NTH gives every pod its grace period, even one that outlasts the instance",
        unit="seconds",
        bounds=(-1, 3600),
    )
    delete_at_deadline: bool = _field(
        False,
        "When a notice gives the instance an end: DELETE_AT_DEADLINE_LEAD before it, delete (grace period 0) "
        "every pod of the drain still on the node, PodDisruptionBudget-blocked ones included, so that their "
        "controllers replace them at once instead of when the node is gone. Counted and evented per pod. "
        "Needs the pods delete permission (the chart grants it with this setting).",
        nth="none",
    )
    delete_at_deadline_lead: float = _field(
        5.0,
        "How long before the instance's end DELETE_AT_DEADLINE deletes what is left.",
        nth="none",
        unit="seconds",
        gt=0,
        le=600,
    )
    drain_relist_after: float = _field(
        5.0,
        "A drain lists its node's pods once more this long after its first list (which follows the cordon), "
        "before it ends, and drains what it finds then: a pod the scheduler bound to the node just before it "
        "saw the cordon. Bounded by the drain's deadline; 0 = list once, as kubectl drain.",
        nth="none: NTH (kubectl drain) lists the node's pods once",
        unit="seconds",
        bounds=(0, 60),
    )
    surge_drains: bool = _field(
        False,
        "Pods annotated `queue-processor/drain: surge` (a Deployment's, through its pod template) get their "
        "replacement first: the Deployment is scaled one replica up, the pod is evicted once the Deployment has "
        "one more available replica, and the count is taken back as the eviction is accepted. Falls back to "
        "eviction (counted, logged) when a HorizontalPodAutoscaler owns the count or time runs short. Needs "
        "deployments get/patch and horizontalpodautoscalers list (the chart grants them with this setting). "
        'See docs/kinds.md, "Replacement before eviction".',
        nth="none",
    )
    drain_budget: int = _field(
        1000,
        "Most nodes drained at once. Cordoning is never held back by it.",
        nth="none: NTH's WORKERS (default 10) capped concurrent events",
        unit="nodes",
        bounds=(1, 100_000),
    )
    drain_budget_non_urgent: str = _field(
        "",
        "Most nodes of one group (DRAIN_BUDGET_GROUP_LABEL) drained at once when every event of theirs leaves "
        "time (rebalance recommendations; AWS Health scheduled changes starting later than "
        "NODE_TERMINATION_GRACE_PERIOD): a count (2) or a percentage of the group's nodes (10%, at least 1). "
        "The others are cordoned and wait their turn, their messages held without taking in-flight slots; an "
        "event that does not leave time (a Spot warning) starts a waiting drain at once. Each replica counts "
        "its own drains. Empty: no limit.",
        nth="none",
        pattern=r"^(|[1-9][0-9]{0,5}|([1-9][0-9]?|100)%)$",
    )
    drain_budget_group_label: str = _field(
        "",
        "The node label whose value names a node's group for DRAIN_BUDGET_NON_URGENT (its size: the nodes "
        "carrying the same value, counted in the watched copy of the nodes at most once a minute; while that copy "
        "is not current a percentage counts as 1). Empty: the instance's Auto Scaling group (its "
        "aws:autoscaling:groupName tag; its size from DescribeAutoScalingGroups).",
        nth="none",
    )
    use_apiserver_cache: bool = _field(
        False,
        "List pods from the API server's watch cache (resourceVersion=0): cheaper, possibly stale. The same "
        "drain filters apply either way.",
        nth="same name; NTH's cache path skipped the kubectl-drain filters, this one does not",
    )
    kube_api_qps: float = _field(
        200.0,
        "Client-side limit on Kubernetes API requests per second.",
        nth="new here: NTH v1.25.6 has no such setting and runs with client-go's default of 5 requests per "
        "second, too low to drain hundreds of nodes inside a Spot notice (NTH's unreleased main branch "
        "adds KUBE_API_QPS)",
        unit="requests/second",
        gt=0,
        le=100_000,
    )
    kube_api_burst: int = _field(
        300,
        "Requests allowed above KUBE_API_QPS in a burst.",
        nth="new here: NTH v1.25.6 runs with client-go's default burst of 10 (NTH's unreleased main branch "
        "adds KUBE_API_BURST)",
        unit="requests",
        bounds=(1, 100_000),
    )
    evictions_in_flight: int = _field(
        0,
        "Most evictions waiting for their first answer at once, across every drain; the others wait as each "
        "drain's plan, a fraction of a suspended request's memory (docs/benchmarks.md). Drains take the free "
        "slots first come first served; a retry waits without one. 0: max(64, 2 x KUBE_API_QPS, "
        "KUBE_API_BURST), two seconds of requests, enough to keep the client's rate busy.",
        nth="none: NTH evicts a node's pods one goroutine each",
        unit="evictions",
        bounds=(0, 1_000_000),
    )
    node_leases: bool = _field(
        False,
        "Claim a coordination.k8s.io/v1 Lease per node before draining it, so that several replicas never "
        "drain one node at once. Turn on with more than one replica (the Helm chart does).",
        nth="none: NTH runs one replica",
    )
    node_lease_duration_sec: int = _field(
        60,
        "How long a replica's own Lease lasts without renewal (it is renewed every third of this while the "
        "replica holds any node Lease); a replica that dies loses the node Leases it held after this.",
        nth="none",
        unit="seconds",
        bounds=(15, 3600),
    )
    # --- lifecycle actions
    heartbeat_interval: int = _field(
        -1,
        "Seconds between RecordLifecycleActionHeartbeat calls while a lifecycle action (terminate, or launch "
        "waiting for its node) is handled: -1 = half the hook's HeartbeatTimeout, 0 = no heartbeats, else "
        "30-3600.",
        nth="same name; NTH's -1 means no heartbeats, here it means automatic (0 turns them off)",
        unit="seconds",
    )
    heartbeat_until: int = _field(
        -1,
        "Stop heartbeats this long after the action started: -1 = until the action is handled (at most "
        "172800, AWS's limit), else 60-172800.",
        nth="same; NTH requires HEARTBEAT_INTERVAL with it and defaults it to 172800",
        unit="seconds",
    )
    complete_warm_pool_launch: bool = _field(
        False,
        "Complete launch lifecycle actions of instances headed for a warm pool too (by default their own "
        "bootstrap does, as AWS recommends for warm pools).",
        nth="none: NTH never completes launch actions for warm pools",
    )
    launch_ready_timeout_sec: int = _field(
        900,
        "How long a node may take to register and turn Ready, from the start of its launch lifecycle action "
        "(the same moment at every receive and on every replica): then the launch action is completed with its "
        "hook's DefaultResult (ABANDON, the group replaces the instance, when the hook cannot be read). Also how "
        "long after an instance's launch a terminate action without a node waits for one to register.",
        nth="none",
        unit="seconds",
        ge=1,
    )
    uncordon_on_return: bool = _field(
        True,
        "Undo our cordon, taints and label when an instance we cordoned comes back into service (a warm-pool "
        "return, a stop followed by a start) and its node is Ready; what others set on the node stays.",
        nth="none: NTH leaves a returning node cordoned",
    )
    return_check_interval_sec: float = _field(
        30.0,
        "How often the nodes we cordoned are checked for an instance back in service (its EC2 LaunchTime "
        "changed since our cordon, running, node Ready): one node LIST by label and one DescribeInstances.",
        nth="none",
        unit="seconds",
        bounds=(1, 3600),
    )
    complete_lifecycle_action_delay_seconds: int = _field(
        -1,
        "Wait this long after the drain, and after a launching instance's node turns Ready, before "
        "CompleteLifecycleAction (as NTH); -1 = no wait. The actions are heartbeated meanwhile.",
        unit="seconds",
        ge=-1,
    )
    # --- telling people
    emit_kubernetes_events: bool = _field(
        False,
        "Record Kubernetes Events for each step, with NTH's reasons (SpotInterruption, PreDrain, CordonAndDrain, "
        "PostDrain, their Error forms, PodEviction on each evicted pod...).",
    )
    kubernetes_events_extra_annotations: str = _field(
        "",
        "Annotations added to every Kubernetes Event: key=value pairs separated by commas. NTH's per-node "
        "annotations (instance-id, availability-zone, region, local-hostname) win over these, as in NTH.",
        nth="same; blanks around keys and values are ignored here, and a value may contain '='",
    )
    webhook_url: SecretStr = _field(
        SecretStr(""), "POST a notification here for each interruption (e.g. a Slack webhook).", secret=True
    )
    webhook_headers: Annotated[dict[str, str], NoDecode] = _field(
        {"Content-type": "application/json"},
        "HTTP headers of the webhook request, as a JSON object.",
        secret=True,
    )
    webhook_template: str = _field(
        DEFAULT_WEBHOOK_TEMPLATE,
        "Body of the webhook request: a Go text/template with sprig functions over NTH's fields ({{ .EventID }}, "
        "{{ .Kind }}, {{ .InstanceID }}, {{ .NodeName }}, {{ .Description }}, {{ .StartTime }}, {{ .Pods }}, "
        "{{ .NodeLabels }}…), rendered as NTH renders it. The subset NTH's users write is supported (see "
        "docs/migration.md); a template outside it, or one that fails over empty data, stops start-up.",
        nth="same fields and values; Go's define/template/block, floats and the sprig functions not listed in "
        "docs/migration.md are refused at start-up",
    )
    webhook_template_file: str = _field(
        "",
        "A file holding the webhook template, read again for every request (a mounted ConfigMap can change); "
        "wins over WEBHOOK_TEMPLATE. Must be readable at start-up; a request whose file cannot be read is not "
        "sent (logged and counted).",
    )
    webhook_proxy: str = _field("", "HTTP(S) proxy for webhook requests.")
    # --- serving and logging
    enable_prometheus_server: bool = _field(
        True,
        "Serve Prometheus metrics on PROMETHEUS_SERVER_PORT at /metrics.",
        nth="same name; NTH's default is false",
    )
    prometheus_server_port: int = _field(
        9092, "Port of the metrics server (0: any free port).", bounds=(0, 65535)
    )
    enable_probes_server: bool = _field(
        True,
        "Serve /healthz and /readyz on PROBES_SERVER_PORT.",
        nth="same name; NTH's default is false, but its chart always turns it on in queue-processor mode",
    )
    probes_server_port: int = _field(8080, "Port of the probes server (0: any free port).", bounds=(0, 65535))
    json_logging: bool = _field(False, "Log JSON lines instead of human-readable lines.")
    log_level: Literal["debug", "info", "warning", "error"] = _field(
        "info", "Least severe level logged.", nth="same; NTH has no warning level"
    )
    pod_name: str = _field(
        "",
        "This pod's name (downward API): a drain of its node evicts the controller's own pod last, once the rest "
        "is gone, and leaves the node's lifecycle actions to its successor.",
        nth="same name; NTH never evicts its own pod and completes its node's action",
    )
    pod_namespace: str = _field(
        "",
        "This pod's namespace (downward API); also where node Leases live when there are several replicas.",
        nth="renamed: NTH reads NAMESPACE, which is accepted too",
        aliases=("NAMESPACE",),
        primary=("pod_namespace",),
    )

    @field_validator("queue_urls", "webhook_headers", "log_level", "taint_effect", mode="before")
    @classmethod
    def _decode(cls, value: Any, info: ValidationInfo) -> Any:
        """Text (from the environment or a flag) as the field takes it: QUEUE_URLS comma-separated,
        WEBHOOK_HEADERS JSON, a choice in any case (``NOSCHEDULE`` is ``NoSchedule``)."""
        if not isinstance(value, str):
            return value
        if info.field_name == "queue_urls":
            return [url.strip() for url in value.split(",") if url.strip()]
        if info.field_name == "webhook_headers":
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("cannot be decoded (a JSON value is expected)") from None
        choices = get_args(cls.model_fields[str(info.field_name)].annotation)
        return {choice.lower(): choice for choice in choices}.get(value.lower(), value)

    @field_validator("queue_url", "queue_urls", "aws_endpoint", "webhook_url")
    @classmethod
    def _check_urls(cls, value: Any, info: ValidationInfo) -> Any:
        """http(s) URLs, and no FIFO queue ("Amazon SQS FIFO queues"): one held message holds back its group."""
        urls = value if isinstance(value, list) else [value]
        for url in (u.get_secret_value() if isinstance(u, SecretStr) else u for u in urls):
            if url and not re.match(r"^https?://[^/\s]+", url):
                raise ValueError("must be an http(s) URL")
            if str(info.field_name).startswith("queue_url") and url.rstrip("/").endswith(".fifo"):
                raise ValueError(
                    f"{url} is a FIFO queue: one held or requeued message would hold back every later message of "
                    "its group, Spot warnings included; use a standard queue (as the Terraform module creates)"
                )
        return value

    @field_validator("kubernetes_events_extra_annotations")
    @classmethod
    def _check_annotations(cls, value: str) -> str:
        parse_annotations(value)
        return value

    @field_validator("webhook_template", "webhook_template_file")
    @classmethod
    def _check_template(cls, value: str, info: ValidationInfo) -> str:
        """NTH's start-up check (with a WEBHOOK_URL): the template parses and executes over empty data."""
        text = value
        if info.field_name == "webhook_template_file" and value:
            try:
                with open(value, encoding="utf-8") as file:
                    text = file.read()
            except OSError as exc:
                raise ValueError(f"cannot be read: {exc.strerror or exc}") from None
        if text and info.data.get("webhook_url", SecretStr("")).get_secret_value():
            try:
                check_template(text)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("heartbeat_interval", "heartbeat_until")
    @classmethod
    def _check_heartbeat(cls, value: int, info: ValidationInfo) -> int:
        if info.field_name == "heartbeat_interval" and value not in (-1, 0) and not 30 <= value <= 3600:
            raise ValueError("must be -1 (automatic), 0 (off) or 30-3600 seconds")
        if info.field_name == "heartbeat_until" and value != -1 and not 60 <= value <= 172800:
            raise ValueError("must be -1 (until handled) or 60-172800 seconds")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if not self.queue_url and not self.queue_urls:
            raise ValueError("QUEUE_URL is not set: give the URL of the SQS queue to consume")
        if self.heartbeat_interval == 0 and self.heartbeat_until != -1:
            raise ValueError("HEARTBEAT_UNTIL is set but HEARTBEAT_INTERVAL=0 turns heartbeats off")
        if self.heartbeat_until != -1 and self.heartbeat_interval > self.heartbeat_until:
            raise ValueError(
                f"HEARTBEAT_INTERVAL={self.heartbeat_interval} must be at most "
                f"HEARTBEAT_UNTIL={self.heartbeat_until}"
            )
        if not self.aws_region:
            region = next(filter(None, map(region_from_queue_url, self.all_queue_urls)), None)
            if region is None:
                raise ValueError("AWS_REGION is not set and the queue URL names no region")
            self.__dict__["aws_region"] = region  # frozen model: set once, during validation
        accounts: dict[str, str] = {}  # every queue in AWS_REGION and one account: EC2 knows no others
        for url in self.all_queue_urls:
            region = region_from_queue_url(url)
            if region is not None and region != self.aws_region:
                raise ValueError(
                    f"queue {url} is in {region} but AWS_REGION is {self.aws_region}: EC2 and Auto Scaling "
                    "are called in one region; run one controller per region"
                )
            account = re.match(r"^https?://[^/]+/(\d{12})/", url)  # the first path segment
            if account is not None:
                accounts.setdefault(account.group(1), url)
        if len(accounts) > 1:
            (first, first_url), (other, other_url) = list(accounts.items())[:2]
            raise ValueError(
                f"queue {other_url} is in account {other}, queue {first_url} in {first}: EC2 and Auto Scaling "
                "are called with one account's credentials; run one controller per account"
            )
        return self

    @property
    def all_queue_urls(self) -> list[str]:
        """QUEUE_URL then QUEUE_URLS, without repeats."""
        return list(dict.fromkeys(url for url in (self.queue_url, *self.queue_urls) if url))


def default(name: str) -> Any:
    """The default of the :class:`Settings` field ``name`` (the only home of a default); ``KeyError`` if none."""
    return Settings.model_fields[name].default
