# IAM: the controller's role (IRSA), the role Auto Scaling assumes to send hook notifications straight to the
# queue (optional), and the statements a customer managed KMS key needs.

# --- the controller ----------------------------------------------------------------------------------------------

# Only the controller's service account, through the cluster's OIDC provider, may assume the role.
data "aws_iam_policy_document" "controller_trust" {
  statement {
    sid     = "ControllerServiceAccount"
    effect  = "Allow"
    actions = ["sts:AssumeRoleWithWebIdentity"]

    principals {
      type        = "Federated"
      identifiers = [var.oidc_provider_arn]
    }

    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:sub"
      values   = ["system:serviceaccount:${var.service_account_namespace}:${var.service_account_name}"]
    }

    condition {
      test     = "StringEquals"
      variable = "${local.oidc_issuer}:aud"
      values   = ["sts.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "controller" {
  name                 = coalesce(var.role_name, "${local.name}-controller")
  path                 = var.role_path
  description          = "queue-processor controller of cluster ${var.cluster_name} (IRSA: ${var.service_account_namespace}/${var.service_account_name})"
  assume_role_policy   = data.aws_iam_policy_document.controller_trust.json
  permissions_boundary = var.role_permissions_boundary_arn
  tags                 = local.tags
}

# Exactly the calls the controller makes (queue_processor/permissions.py, AWS_ACTIONS), each on the narrowest
# resource the Service Authorization Reference allows for it.
data "aws_iam_policy_document" "controller" {
  # ReceiveMessage, DeleteMessageBatch and ChangeMessageVisibility(Batch): the batch calls are authorised by
  # the single-message actions. Only this queue; the dead-letter queue is for people.
  statement {
    sid       = "ConsumeTheQueue"
    effect    = "Allow"
    actions   = ["sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:ReceiveMessage"]
    resources = [aws_sqs_queue.this.arn]
  }

  # Node resolution, and the tagged-instances gauge. Neither action supports resource-level permissions: "*" is
  # the only valid resource.
  statement {
    sid       = "ResolveNodes"
    effect    = "Allow"
    actions   = ["ec2:DescribeInstances", "ec2:DescribeTags"]
    resources = ["*"]
  }

  # Heartbeat and complete lifecycle actions: both require the autoScalingGroup resource type, so they are
  # limited to the cluster's groups.
  statement {
    sid       = "HandleLifecycleActionsOfTheClusterGroups"
    effect    = "Allow"
    actions   = ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"]
    resources = local.asg_arns
  }

  # The hook's HeartbeatTimeout, read once per hook to pace heartbeats; a group's size, read at most once a
  # minute for a percentage in DRAIN_BUDGET_NON_URGENT; whether an instance still waits in a hook, asked before
  # the first heartbeat of an action received again. Describe calls have no resource type: "*" only.
  statement {
    sid    = "ReadHookTimeouts"
    effect = "Allow"
    actions = [
      "autoscaling:DescribeAutoScalingGroups",
      "autoscaling:DescribeAutoScalingInstances",
      "autoscaling:DescribeLifecycleHooks",
    ]
    resources = ["*"]
  }

  # With SSE-KMS, SQS decrypts a message for the receiver with the receiver's own permission on the key, so
  # ReceiveMessage fails without kms:Decrypt. Nothing else is needed: the controller never sends a message
  # (GenerateDataKey is the sender's), and deleting or changing visibility touches no message content. The
  # conditions limit the grant to SQS using the key for this queue.
  dynamic "statement" {
    for_each = local.kms_enabled ? [var.kms_key_arn] : []

    content {
      sid       = "DecryptQueueMessages"
      effect    = "Allow"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["sqs.${local.region}.${local.dns_suffix}"]
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:sqs:arn"
        values   = [aws_sqs_queue.this.arn]
      }
    }
  }
}

resource "aws_iam_role_policy" "controller" {
  name   = "queue-processor"
  role   = aws_iam_role.controller.id
  policy = data.aws_iam_policy_document.controller.json
}

# --- Auto Scaling notifications straight to the queue (enable_direct_lifecycle_notifications) ---------------------

# Auto Scaling assumes this role to send a hook's notifications. It fills in aws:SourceAccount and
# aws:SourceArn (the group) when it assumes a role, so the trust is limited to the cluster's groups: no other
# group, and no other account's Auto Scaling, can deliver through it.
data "aws_iam_policy_document" "asg_notifications_trust" {
  count = var.enable_direct_lifecycle_notifications ? 1 : 0

  statement {
    sid     = "AutoScalingForTheClusterGroups"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["autoscaling.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = local.asg_arns
    }
  }
}

resource "aws_iam_role" "asg_notifications" {
  count = var.enable_direct_lifecycle_notifications ? 1 : 0

  name                 = "${local.name}-asg-notifications"
  path                 = var.role_path
  description          = "Lets Auto Scaling send the queue-processor hooks' notifications of cluster ${var.cluster_name} to its queue"
  assume_role_policy   = data.aws_iam_policy_document.asg_notifications_trust[0].json
  permissions_boundary = var.role_permissions_boundary_arn
  tags                 = local.tags
}

data "aws_iam_policy_document" "asg_notifications" {
  count = var.enable_direct_lifecycle_notifications ? 1 : 0

  # The two SQS actions of AWS's own policy for this role (AutoScalingNotificationAccessRole), on this queue
  # only: Auto Scaling resolves the queue, then sends.
  statement {
    sid       = "SendHookNotifications"
    effect    = "Allow"
    actions   = ["sqs:GetQueueUrl", "sqs:SendMessage"]
    resources = [aws_sqs_queue.this.arn]
  }

  # SQS asks both of a sender to an SSE-KMS queue: GenerateDataKey for a new data key, Decrypt to reuse one.
  # This identity grant works when the key policy delegates to IAM (the default key policy does).
  dynamic "statement" {
    for_each = local.kms_enabled ? [var.kms_key_arn] : []

    content {
      sid       = "EncryptHookNotifications"
      effect    = "Allow"
      actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
      resources = [statement.value]

      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["sqs.${local.region}.${local.dns_suffix}"]
      }

      condition {
        test     = "StringEquals"
        variable = "kms:EncryptionContext:aws:sqs:arn"
        values   = [aws_sqs_queue.this.arn]
      }
    }
  }
}

resource "aws_iam_role_policy" "asg_notifications" {
  count = var.enable_direct_lifecycle_notifications ? 1 : 0

  name   = "send-hook-notifications"
  role   = aws_iam_role.asg_notifications[0].id
  policy = data.aws_iam_policy_document.asg_notifications[0].json
}

# --- customer managed KMS key ----------------------------------------------------------------------------------------

# EventBridge is a service principal: only the key policy can let it use the key, and this module does not own
# the key. These statements are output (kms_key_policy_json) for the key's owner to merge into its policy;
# without them every event lands in neither queue and EventBridge reports FailedInvocations.
#
# No count here, on purpose: whether kms_key_arn is null is unknown at plan time when the key is created in the
# same apply, and a count must be known. The document costs nothing; the output is null without a key.
data "aws_iam_policy_document" "kms_for_eventbridge" {
  statement {
    sid       = "QueueProcessorEventBridgeRules"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }

    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = local.rule_arns
    }
  }
}
