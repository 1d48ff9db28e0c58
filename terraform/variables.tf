# ---------------------------------------------------------------------------------------------------------------------
# The cluster and the controller's identity (IRSA)
# ---------------------------------------------------------------------------------------------------------------------

variable "cluster_name" {
  description = "Name of the Kubernetes cluster the controller runs in. Used in resource names (see name_prefix) and tags."
  type        = string

  validation {
    condition     = can(regex("^[0-9A-Za-z][A-Za-z0-9_-]{0,99}$", var.cluster_name))
    error_message = "cluster_name must be 1-100 characters: letters, digits, '-' and '_', starting with a letter or digit (the EKS rule)."
  }
}

variable "asg_names" {
  description = "Names of the Auto Scaling groups whose instances are cluster nodes. The lifecycle hooks go on these groups, the lifecycle-action rules only match them, and the controller may only heartbeat and complete lifecycle actions of these groups."
  type        = list(string)

  validation {
    condition     = length(var.asg_names) > 0 && length(var.asg_names) == length(distinct(var.asg_names))
    error_message = "asg_names must name at least one Auto Scaling group, each once."
  }

  validation {
    condition     = alltrue([for name in var.asg_names : can(regex("^[^*?]{1,255}$", name))])
    error_message = "Each Auto Scaling group name must be 1-255 characters without '*' or '?' (they would act as wildcards in the IAM policy)."
  }
}

variable "oidc_provider_arn" {
  description = "ARN of the cluster's IAM OIDC identity provider (for EKS: aws_iam_openid_connect_provider or the EKS module's oidc_provider_arn)."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/.+$", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must look like arn:aws:iam::123456789012:oidc-provider/oidc.eks.<region>.amazonaws.com/id/<ID>."
  }
}

variable "oidc_provider_url" {
  description = "Issuer URL of the cluster's OIDC provider, with or without the https:// scheme (e.g. oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE)."
  type        = string

  validation {
    condition     = can(regex("^(https://)?[A-Za-z0-9.-]+(/[^\\s/]+)*$", var.oidc_provider_url))
    error_message = "oidc_provider_url must be a host name optionally followed by a path, without spaces or a trailing '/'."
  }
}

variable "service_account_namespace" {
  description = "Namespace of the controller's Kubernetes service account; must match the Helm release's namespace, or the role cannot be assumed."
  type        = string
  default     = "kube-system"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.service_account_namespace))
    error_message = "service_account_namespace must be a Kubernetes namespace name (RFC 1123 label)."
  }
}

variable "service_account_name" {
  description = "Name of the controller's Kubernetes service account; must match the chart's serviceAccount.name, or the role cannot be assumed."
  type        = string
  default     = "queue-processor"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", var.service_account_name))
    error_message = "service_account_name must be a Kubernetes object name (RFC 1123 subdomain)."
  }
}

variable "role_name" {
  description = "Name of the controller's IAM role. Default: <name_prefix>-controller."
  type        = string
  default     = null

  validation {
    condition     = var.role_name == null || can(regex("^[A-Za-z0-9+=,.@_-]{1,64}$", coalesce(var.role_name, "x")))
    error_message = "role_name must be 1-64 characters from A-Z a-z 0-9 +=,.@_-."
  }
}

variable "role_path" {
  description = "Path of the IAM roles the module creates."
  type        = string
  default     = "/"

  validation {
    condition     = can(regex("^/([!-~]{0,510}/)?$", var.role_path))
    error_message = "role_path must start and end with '/'."
  }
}

variable "role_permissions_boundary_arn" {
  description = "ARN of a managed policy set as permissions boundary on the IAM roles the module creates; null for none."
  type        = string
  default     = null

  validation {
    condition     = var.role_permissions_boundary_arn == null || can(regex("^arn:aws[a-z-]*:iam::([0-9]{12}|aws):policy/.+$", coalesce(var.role_permissions_boundary_arn, "x")))
    error_message = "role_permissions_boundary_arn must be an IAM policy ARN."
  }
}

variable "name_prefix" {
  description = "Prefix of every resource name (queues, rules, roles, alarms). Default: <cluster_name>-qp. At most 30 characters, so that the longest EventBridge rule name stays within AWS's 64."
  type        = string
  default     = null

  validation {
    condition     = var.name_prefix == null || can(regex("^[A-Za-z0-9_-]{1,30}$", coalesce(var.name_prefix, "x")))
    error_message = "name_prefix must be 1-30 characters: letters, digits, '-' and '_'."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes tags."
  type        = map(string)
  default     = {}
}

# ---------------------------------------------------------------------------------------------------------------------
# Lifecycle hooks
# ---------------------------------------------------------------------------------------------------------------------

variable "create_lifecycle_hooks" {
  description = "Create the lifecycle hooks on asg_names. Set to false when the groups already declare them (e.g. as initial_lifecycle_hook blocks, so the first instances are covered too); the hooks must then be named terminate_hook_name and launch_hook_name, because the rules only match those names."
  type        = bool
  default     = true
}

variable "terminate_hook_name" {
  description = "Name of the terminate lifecycle hook. The terminate rule matches only this hook, so the controller never completes a lifecycle action that belongs to somebody else's hook."
  type        = string
  default     = "queue-processor-terminate"

  validation {
    condition     = can(regex("^[A-Za-z0-9/_-]{1,255}$", var.terminate_hook_name))
    error_message = "terminate_hook_name must be 1-255 characters from A-Z a-z 0-9 - _ /."
  }
}

variable "hook_heartbeat_timeout_seconds" {
  description = "HeartbeatTimeout of the terminate hook: how long an instance waits in Terminating:Wait without a heartbeat. The controller heartbeats while it drains (HEARTBEAT_INTERVAL -1 = half of this), so this only bounds the wait when the controller is down; the hook then CONTINUEs and the instance terminates undrained."
  type        = number
  default     = 300

  validation {
    condition     = var.hook_heartbeat_timeout_seconds >= 30 && var.hook_heartbeat_timeout_seconds <= 7200 && floor(var.hook_heartbeat_timeout_seconds) == var.hook_heartbeat_timeout_seconds
    error_message = "hook_heartbeat_timeout_seconds must be a whole number from 30 to 7200 (AWS's range)."
  }
}

variable "enable_launch_lifecycle_hook" {
  description = "Also create a launch lifecycle hook and the rule for its actions: an instance stays in Pending:Wait until the controller sees its node Ready (or, for a warm pool, until its own bootstrap completes the action)."
  type        = bool
  default     = false
}

variable "launch_hook_name" {
  description = "Name of the launch lifecycle hook (used when enable_launch_lifecycle_hook is true)."
  type        = string
  default     = "queue-processor-launch"

  validation {
    condition     = can(regex("^[A-Za-z0-9/_-]{1,255}$", var.launch_hook_name))
    error_message = "launch_hook_name must be 1-255 characters from A-Z a-z 0-9 - _ /."
  }
}

variable "launch_hook_heartbeat_timeout_seconds" {
  description = "HeartbeatTimeout of the launch hook. The controller heartbeats a launch action while it waits for the node (up to its LAUNCH_READY_TIMEOUT_SEC, default 900), so this must only outlast one heartbeat interval plus a requeue backoff; with the controller down, it is how long a new instance waits before the default result applies."
  type        = number
  default     = 900

  validation {
    condition     = var.launch_hook_heartbeat_timeout_seconds >= 30 && var.launch_hook_heartbeat_timeout_seconds <= 7200 && floor(var.launch_hook_heartbeat_timeout_seconds) == var.launch_hook_heartbeat_timeout_seconds
    error_message = "launch_hook_heartbeat_timeout_seconds must be a whole number from 30 to 7200."
  }
}

variable "launch_hook_default_result" {
  description = "What happens to a launching instance whose node is not Ready in time, whether the controller completes its action after LAUNCH_READY_TIMEOUT_SEC or Auto Scaling times it out: ABANDON (terminate it and launch another; a node that never turned Ready is not put in service) or CONTINUE (put it in service anyway). See the README for the trade-off."
  type        = string
  default     = "ABANDON"

  validation {
    condition     = contains(["ABANDON", "CONTINUE"], var.launch_hook_default_result)
    error_message = "launch_hook_default_result must be ABANDON or CONTINUE."
  }
}

variable "enable_direct_lifecycle_notifications" {
  description = "Also let the hooks send their notifications straight to the queue (NotificationTargetARN), through an IAM role Auto Scaling assumes. The EventBridge rules stay: the controller recognises both copies of one lifecycle action (same token) and handles it once. Needs create_lifecycle_hooks."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------------------------------------------------
# Queues
# ---------------------------------------------------------------------------------------------------------------------

variable "queue_message_retention_seconds" {
  description = "How long the queue keeps a message. It must outlast the trip of a poison message to the dead-letter queue: max_receive_count receives, each followed by the controller's POISON_VISIBILITY_TIMEOUT_SEC (default 3600), so 10 hours with the defaults."
  type        = number
  default     = 345600

  validation {
    condition     = var.queue_message_retention_seconds >= 60 && var.queue_message_retention_seconds <= 1209600
    error_message = "queue_message_retention_seconds must be from 60 to 1209600 (14 days)."
  }
}

variable "queue_visibility_timeout_seconds" {
  description = "The queue's default visibility timeout. The controller sets its own on every receive (SQS_MSG_VISIBILITY_TIMEOUT_SEC) and renews it, so this only applies to other readers, such as an operator's aws sqs receive-message."
  type        = number
  default     = 60

  validation {
    condition     = var.queue_visibility_timeout_seconds >= 0 && var.queue_visibility_timeout_seconds <= 43200
    error_message = "queue_visibility_timeout_seconds must be from 0 to 43200 (12 hours)."
  }
}

variable "max_receive_count" {
  description = "Receives after which SQS moves a message to the dead-letter queue. Every requeue (drain timed out, PDB blocked) and every poison receive counts; with 10 a requeued event is retried for about an hour (backoff 10 s doubling to 900 s) before it is parked."
  type        = number
  default     = 10

  validation {
    condition     = var.max_receive_count >= 1 && var.max_receive_count <= 1000 && floor(var.max_receive_count) == var.max_receive_count
    error_message = "max_receive_count must be a whole number from 1 to 1000."
  }
}

variable "dlq_message_retention_seconds" {
  description = "How long the dead-letter queue keeps a message. For a standard queue the clock started when the message entered the source queue, so this must be longer than queue_message_retention_seconds; 14 days leaves time to inspect and redrive."
  type        = number
  default     = 1209600

  validation {
    condition     = var.dlq_message_retention_seconds >= 60 && var.dlq_message_retention_seconds <= 1209600
    error_message = "dlq_message_retention_seconds must be from 60 to 1209600 (14 days)."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer managed KMS key to encrypt both queues with (SSE-KMS); null encrypts them with SQS-managed keys (SSE-SQS). The key policy must let EventBridge use the key: merge the kms_key_policy_json output into it. The AWS managed key alias/aws/sqs cannot be used (its policy cannot admit EventBridge)."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/[A-Za-z0-9-]+$", coalesce(var.kms_key_arn, "x")))
    error_message = "kms_key_arn must be a key ARN (arn:aws:kms:<region>:<account>:key/<id>), not an alias: IAM policies are written against the key ARN."
  }
}

variable "kms_data_key_reuse_period_seconds" {
  description = "With kms_key_arn: how long SQS reuses a data key before asking KMS again (fewer KMS calls, lower cost)."
  type        = number
  default     = 300

  validation {
    condition     = var.kms_data_key_reuse_period_seconds >= 60 && var.kms_data_key_reuse_period_seconds <= 86400
    error_message = "kms_data_key_reuse_period_seconds must be from 60 to 86400."
  }
}

# ---------------------------------------------------------------------------------------------------------------------
# Alarms
# ---------------------------------------------------------------------------------------------------------------------

variable "create_alarms" {
  description = "Create the three CloudWatch alarms (oldest message age, messages visible, dead-letter queue not empty)."
  type        = bool
  default     = true
}

variable "alarm_actions" {
  description = "SNS topic ARNs notified when an alarm goes to ALARM."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.alarm_actions : can(regex("^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:.+$", arn))])
    error_message = "Each alarm action must be an SNS topic ARN."
  }
}

variable "ok_actions" {
  description = "SNS topic ARNs notified when an alarm returns to OK."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.ok_actions : can(regex("^arn:aws[a-z-]*:sns:[a-z0-9-]+:[0-9]{12}:.+$", arn))])
    error_message = "Each OK action must be an SNS topic ARN."
  }
}

variable "runbook_url" {
  description = "Where the operator runbook lives; each alarm's description links to its section (#oldest-message-age, #messages-visible, #dead-letter-queue-not-empty). Point it at your copy of docs/runbook.md (a full URL is clickable in the alarm notification)."
  type        = string
  default     = "docs/runbook.md"

  validation {
    condition     = length(var.runbook_url) > 0 && !strcontains(var.runbook_url, "#")
    error_message = "runbook_url must be non-empty and without a '#' fragment: the alarms append their own."
  }
}

variable "alarm_period_seconds" {
  description = "Period of the queue alarms. SQS publishes these metrics once a minute, so 60 is the finest that makes sense."
  type        = number
  default     = 60

  validation {
    condition     = var.alarm_period_seconds >= 60 && var.alarm_period_seconds % 60 == 0
    error_message = "alarm_period_seconds must be a multiple of 60."
  }
}

variable "alarm_evaluation_periods" {
  description = "Consecutive periods over threshold before the oldest-message-age and messages-visible alarms fire."
  type        = number
  default     = 3

  validation {
    condition     = var.alarm_evaluation_periods >= 1 && floor(var.alarm_evaluation_periods) == var.alarm_evaluation_periods
    error_message = "alarm_evaluation_periods must be a whole number >= 1."
  }
}

variable "oldest_message_age_alarm_threshold_seconds" {
  description = "Alarm when the oldest message (in flight or not) is older than this. A Spot notice is worthless after 120 s and a drain attempt lasts NODE_TERMINATION_GRACE_PERIOD (default 120 s) before a requeue, so a message ten minutes old means the controller is down or a drain keeps failing."
  type        = number
  default     = 600

  validation {
    condition     = var.oldest_message_age_alarm_threshold_seconds >= 60
    error_message = "oldest_message_age_alarm_threshold_seconds must be >= 60."
  }
}

variable "messages_visible_alarm_threshold" {
  description = "Alarm when more messages than this wait to be received. The controller long-polls without pause, so a backlog that lasts alarm_evaluation_periods means it is not receiving (down, no credentials, wrong QUEUE_URL) or its in-flight budget is full."
  type        = number
  default     = 10

  validation {
    condition     = var.messages_visible_alarm_threshold >= 0
    error_message = "messages_visible_alarm_threshold must be >= 0."
  }
}
