{{/*
Names and labels (Helm's conventions: names are DNS labels, at most 63 characters).
*/}}
{{- define "queue-processor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "queue-processor.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "queue-processor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "queue-processor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "queue-processor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "queue-processor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.customLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "queue-processor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "queue-processor.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "queue-processor.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Controller settings: environment variable -> value key, one line per setting of Settings in
queue_processor/config.py. This is the only place the chart maps values to variables: the Deployment sets
each variable whose value is not empty, and tests/deploy/test_chart.py checks this list against Settings
(every field covered, the schema types matching the field types). The settings not listed here are set
elsewhere in the Deployment: WEBHOOK_URL and WEBHOOK_HEADERS from a Secret ("queue-processor.webhookEnv"),
POD_NAME and POD_NAMESPACE from the downward API. NODE_LEASES is also on whenever replicas > 1, and
WEBHOOK_TEMPLATE comes from a ConfigMap when webhookTemplateConfigMapName is set.
*/}}
{{- define "queue-processor.settingsEnv" -}}
QUEUE_URL: queueURL
QUEUE_URLS: queueURLs
AWS_REGION: awsRegion
AWS_ENDPOINT: awsEndpoint
SQS_MSG_VISIBILITY_TIMEOUT_SEC: sqsMsgVisibilityTimeoutSec
RECEIVE_LOOPS_PER_QUEUE: receiveLoopsPerQueue
RECEIVE_WAIT_TIME_SEC: receiveWaitTimeSec
SHUTDOWN_TIMEOUT_SEC: shutdownTimeoutSec
IN_FLIGHT_BUDGET: inFlightBudget
POISON_VISIBILITY_TIMEOUT_SEC: poisonVisibilityTimeoutSec
REQUEUE_BACKOFF_BASE_SEC: requeueBackoffBaseSec
DELETE_SQS_MSG_IF_NODE_NOT_FOUND: deleteSqsMsgIfNodeNotFound
CHECK_TAG_BEFORE_DRAINING: checkTagBeforeDraining
MANAGED_TAG: managedTag
MANAGED_TAG_VALUE: managedTagValue
USE_PROVIDER_ID: useProviderId
DRY_RUN: dryRun
CORDON_ONLY: cordonOnly
TAINT_NODE: taintNode
TAINT_EFFECT: taintEffect
ENABLE_OUT_OF_SERVICE_TAINT: enableOutOfServiceTaint
EXCLUDE_FROM_LOAD_BALANCERS: excludeFromLoadBalancers
DELETE_LOCAL_DATA: deleteLocalData
IGNORE_DAEMON_SETS: ignoreDaemonSets
POD_TERMINATION_GRACE_PERIOD: podTerminationGracePeriod
NODE_TERMINATION_GRACE_PERIOD: nodeTerminationGracePeriod
DRAIN_ORDER: drainOrder
DRAIN_CRITICAL_PRIORITY: drainCriticalPriority
GRACE_DEADLINE_MARGIN: graceDeadlineMargin
DELETE_AT_DEADLINE: deleteAtDeadline
DELETE_AT_DEADLINE_LEAD: deleteAtDeadlineLead
DRAIN_RELIST_AFTER: drainRelistAfter
SURGE_DRAINS: surgeDrains
DRAIN_BUDGET: drainBudget
DRAIN_BUDGET_NON_URGENT: drainBudgetNonUrgent
DRAIN_BUDGET_GROUP_LABEL: drainBudgetGroupLabel
USE_APISERVER_CACHE: useAPIServerCacheToListPods
KUBE_API_QPS: kubeAPIQPS
KUBE_API_BURST: kubeAPIBurst
EVICTIONS_IN_FLIGHT: evictionsInFlight
NODE_LEASES: nodeLeases
NODE_LEASE_DURATION_SEC: nodeLeaseDurationSec
HEARTBEAT_INTERVAL: heartbeatInterval
HEARTBEAT_UNTIL: heartbeatUntil
COMPLETE_WARM_POOL_LAUNCH: completeWarmPoolLaunch
LAUNCH_READY_TIMEOUT_SEC: launchReadyTimeoutSec
UNCORDON_ON_RETURN: uncordonOnReturn
RETURN_CHECK_INTERVAL_SEC: returnCheckIntervalSec
COMPLETE_LIFECYCLE_ACTION_DELAY_SECONDS: completeLifecycleActionDelaySeconds
EMIT_KUBERNETES_EVENTS: emitKubernetesEvents
KUBERNETES_EVENTS_EXTRA_ANNOTATIONS: kubernetesEventsExtraAnnotations
WEBHOOK_TEMPLATE: webhookTemplate
WEBHOOK_TEMPLATE_FILE: webhookTemplateFile
WEBHOOK_PROXY: webhookProxy
ENABLE_PROMETHEUS_SERVER: enablePrometheusServer
PROMETHEUS_SERVER_PORT: prometheusServerPort
ENABLE_PROBES_SERVER: enableProbesServer
PROBES_SERVER_PORT: probesServerPort
JSON_LOGGING: jsonLogging
LOG_LEVEL: logLevel
{{- end }}

{{/*
A value as the controller reads it from its environment: lists comma-separated (QUEUE_URLS), maps as JSON
(WEBHOOK_HEADERS), whole numbers without a decimal point or an exponent (Helm reads every YAML number as a
float64, which would otherwise print 1e+06), the rest as text (booleans: true / false).
*/}}
{{- define "queue-processor.envValue" -}}
{{- if kindIs "slice" . }}{{ join "," . }}
{{- else if kindIs "map" . }}{{ toJson . }}
{{- else if and (kindIs "float64" .) (eq . (floor .)) }}{{ int64 . }}
{{- else }}{{ . }}
{{- end }}
{{- end }}

{{/* "true" when node Leases are on: asked for, or needed because several replicas consume the queue. */}}
{{- define "queue-processor.nodeLeases" -}}
{{- if or .Values.nodeLeases (gt (int .Values.replicas) 1) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
Kubernetes RBAC rules, the same list as KUBERNETES_RULES in queue_processor/permissions.py (the test fails
when they differ): exactly the requests the controller makes. "when" names the setting that makes the
controller use a rule; "clusterWide: false" rules go into a Role in the release namespace.
*/}}
{{- define "queue-processor.rbacRules" -}}
- {apiGroup: "", resource: nodes, verbs: [get, list, patch, watch], clusterWide: true, when: ""}
- {apiGroup: "", resource: pods, verbs: [list, watch], clusterWide: true, when: ""}
- {apiGroup: "", resource: pods/eviction, verbs: [create], clusterWide: true, when: ""}
- {apiGroup: "", resource: pods, verbs: [delete], clusterWide: true, when: DELETE_AT_DEADLINE}
- {apiGroup: apps, resource: deployments, verbs: [get, patch], clusterWide: true, when: SURGE_DRAINS}
- {apiGroup: autoscaling, resource: horizontalpodautoscalers, verbs: [list], clusterWide: true, when: SURGE_DRAINS}
- {apiGroup: policy, resource: poddisruptionbudgets, verbs: [get], clusterWide: true, when: ""}
- {apiGroup: "", resource: events, verbs: [create], clusterWide: true, when: EMIT_KUBERNETES_EVENTS}
- {apiGroup: coordination.k8s.io, resource: leases, verbs: [get, list, watch, create, update, patch, delete, deletecollection], clusterWide: false, when: NODE_LEASES}
{{- end }}

{{/* The RBAC rules in force, as a YAML list: those of the given scope whose setting is on. */}}
{{- define "queue-processor.rbacRulesInForce" -}}
{{- $root := index . 0 }}
{{- $clusterWide := index . 1 }}
{{- $on := dict "" true "EMIT_KUBERNETES_EVENTS" $root.Values.emitKubernetesEvents "NODE_LEASES" (eq (include "queue-processor.nodeLeases" $root) "true") "DELETE_AT_DEADLINE" $root.Values.deleteAtDeadline "SURGE_DRAINS" $root.Values.surgeDrains }}
{{- $rules := list }}
{{- range include "queue-processor.rbacRules" $root | fromYamlArray }}
{{- if not (hasKey $on .when) }}
{{- fail (printf "RBAC rule for %s depends on %s, which the chart does not know" .resource .when) }}
{{- end }}
{{- if and (eq .clusterWide $clusterWide) (index $on .when) }}
{{- $rules = append $rules (dict "apiGroups" (list .apiGroup) "resources" (list .resource) "verbs" .verbs) }}
{{- end }}
{{- end }}
{{- toYaml $rules }}
{{- end }}

{{/* The webhook headers as the JSON text WEBHOOK_HEADERS takes (NTH's chart took a string; a map works too). */}}
{{- define "queue-processor.webhookHeaders" -}}
{{- if kindIs "string" .Values.webhookHeaders }}{{ .Values.webhookHeaders }}
{{- else if .Values.webhookHeaders }}{{ toJson .Values.webhookHeaders }}
{{- end }}
{{- end }}

{{- define "queue-processor.webhookSecretName" -}}
{{- printf "%s-webhook" (include "queue-processor.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
What the chart's own webhook Secret holds (a YAML map, {} when the chart needs no Secret): the URL and the
headers given as plain values, which are credentials and so never go into the Deployment itself.
*/}}
{{- define "queue-processor.webhookSecretData" -}}
{{- $data := dict }}
{{- if and .Values.webhookURL (not .Values.webhookURLSecretName) }}
{{- $_ := set $data "webhookurl" .Values.webhookURL }}
{{- end }}
{{- $headers := include "queue-processor.webhookHeaders" . }}
{{- if and $headers (not (and .Values.webhookURLSecretName .Values.webhookHeadersSecretKey)) }}
{{- $_ := set $data "webhookheaders" $headers }}
{{- end }}
{{- toYaml $data }}
{{- end }}

{{/* WEBHOOK_URL, WEBHOOK_HEADERS (from a Secret) and WEBHOOK_TEMPLATE (from a ConfigMap), when configured. */}}
{{- define "queue-processor.webhookEnv" -}}
{{- if .Values.webhookURLSecretName }}
- name: WEBHOOK_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.webhookURLSecretName }}
      key: {{ .Values.webhookURLSecretKey }}
{{- else if .Values.webhookURL }}
- name: WEBHOOK_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "queue-processor.webhookSecretName" . }}
      key: webhookurl
{{- end }}
{{- if and .Values.webhookURLSecretName .Values.webhookHeadersSecretKey }}
- name: WEBHOOK_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .Values.webhookURLSecretName }}
      key: {{ .Values.webhookHeadersSecretKey }}
{{- else if include "queue-processor.webhookHeaders" . }}
- name: WEBHOOK_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ include "queue-processor.webhookSecretName" . }}
      key: webhookheaders
{{- end }}
{{- if .Values.webhookTemplateConfigMapName }}
- name: WEBHOOK_TEMPLATE
  valueFrom:
    configMapKeyRef:
      name: {{ .Values.webhookTemplateConfigMapName }}
      key: {{ .Values.webhookTemplateConfigMapKey }}
{{- end }}
{{- end }}

{{/* Combinations the schema cannot express; each stops the render with one line naming the values. */}}
{{- define "queue-processor.validate" -}}
{{- if not (or .Values.queueURL .Values.queueURLs) }}
{{- fail "queueURL (or queueURLs) is required: the URL of the SQS queue that EventBridge rules and lifecycle hooks send to" }}
{{- end }}
{{- if not .Values.enableSqsTerminationDraining }}
{{- fail "enableSqsTerminationDraining=false: this chart only runs the queue-processor mode (IMDS mode is not provided)" }}
{{- end }}
{{- if and .Values.webhookURL .Values.webhookURLSecretName }}
{{- fail "webhookURL and webhookURLSecretName are both set: give the URL one way" }}
{{- end }}
{{- if and .Values.webhookHeadersSecretKey (not .Values.webhookURLSecretName) }}
{{- fail "webhookHeadersSecretKey is set but webhookURLSecretName is not: it names a key of that Secret" }}
{{- end }}
{{- if ne (empty .Values.webhookTemplateConfigMapName) (empty .Values.webhookTemplateConfigMapKey) }}
{{- fail "webhookTemplateConfigMapName and webhookTemplateConfigMapKey go together: set both or neither" }}
{{- end }}
{{- if and (or .Values.serviceMonitor.create .Values.prometheusRule.create) (not .Values.enablePrometheusServer) }}
{{- fail "serviceMonitor.create / prometheusRule.create need enablePrometheusServer=true: there is nothing to scrape" }}
{{- end }}
{{- end }}

{{/* Label matchers that select this release's series in the alert expressions. */}}
{{- define "queue-processor.alertSelector" -}}
{{- if .Values.prometheusRule.selector }}{{ .Values.prometheusRule.selector }}
{{- else }}job="{{ include "queue-processor.fullname" . }}",namespace="{{ .Release.Namespace }}"
{{- end }}
{{- end }}
