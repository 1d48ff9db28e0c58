# The queue the controller consumes, and its dead-letter queue.
#
# Both are encrypted at rest: with the customer managed key kms_key_arn when given (SSE-KMS), otherwise with
# keys SQS owns (SSE-SQS), which costs nothing and needs no key policy.

resource "aws_sqs_queue" "dlq" {
  name                              = "${local.name}-dlq"
  message_retention_seconds         = var.dlq_message_retention_seconds
  sqs_managed_sse_enabled           = local.kms_enabled ? null : true
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.kms_enabled ? var.kms_data_key_reuse_period_seconds : null
  tags                              = local.tags

  lifecycle {
    precondition {
      condition     = length(local.name) <= 30
      error_message = "The name prefix \"${local.name}\" is longer than 30 characters (EventBridge rule names would pass AWS's 64): set name_prefix."
    }

    precondition {
      condition     = var.dlq_message_retention_seconds >= var.queue_message_retention_seconds
      error_message = "dlq_message_retention_seconds must be at least queue_message_retention_seconds: a message's age in the dead-letter queue counts from when it entered the source queue."
    }

    precondition {
      condition     = !var.enable_direct_lifecycle_notifications || var.create_lifecycle_hooks
      error_message = "enable_direct_lifecycle_notifications needs create_lifecycle_hooks: the notification target is set on the hooks this module creates."
    }
  }
}

resource "aws_sqs_queue" "this" {
  name                       = local.name
  message_retention_seconds  = var.queue_message_retention_seconds
  visibility_timeout_seconds = var.queue_visibility_timeout_seconds
  # Long polling by default, for any reader; the controller asks for it on every receive anyway.
  receive_wait_time_seconds         = 20
  sqs_managed_sse_enabled           = local.kms_enabled ? null : true
  kms_master_key_id                 = var.kms_key_arn
  kms_data_key_reuse_period_seconds = local.kms_enabled ? var.kms_data_key_reuse_period_seconds : null
  tags                              = local.tags

  # The controller never deletes a message it cannot parse; SQS moves it here after max_receive_count receives.
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq.arn
    maxReceiveCount     = var.max_receive_count
  })
}

# Only the controller's queue may use the dead-letter queue as its DLQ. A separate resource, because the queue
# refers to the DLQ (redrive policy) and this refers back to the queue.
resource "aws_sqs_queue_redrive_allow_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id

  redrive_allow_policy = jsonencode({
    redrivePermission = "byQueue"
    sourceQueueArns   = [aws_sqs_queue.this.arn]
  })
}

# Who may send to the queue: this module's EventBridge rules, and (enable_direct_lifecycle_notifications) the
# role Auto Scaling assumes to deliver hook notifications. The controller's own permissions are in its role.
data "aws_iam_policy_document" "queue" {
  statement {
    sid       = "EventBridgeRulesOfThisModule"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.this.arn]

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

  # Auto Scaling does not send as a service principal: it assumes the notification role, whose trust policy
  # carries the aws:SourceAccount and aws:SourceArn (these groups) conditions. Naming the role here makes this
  # policy the complete list of senders.
  dynamic "statement" {
    for_each = var.enable_direct_lifecycle_notifications ? [aws_iam_role.asg_notifications[0].arn] : []

    content {
      sid       = "AutoScalingLifecycleNotifications"
      effect    = "Allow"
      actions   = ["sqs:GetQueueUrl", "sqs:SendMessage"]
      resources = [aws_sqs_queue.this.arn]

      principals {
        type        = "AWS"
        identifiers = [statement.value]
      }
    }
  }

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.this.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "this" {
  queue_url = aws_sqs_queue.this.id
  policy    = data.aws_iam_policy_document.queue.json
}

# The dead-letter queue also receives what EventBridge could not deliver to the queue (each rule target's
# dead-letter config), e.g. while a KMS key policy is missing its EventBridge statement. Such a message carries
# the attributes ERROR_CODE, ERROR_MESSAGE and RULE_ARN, and its body is the event itself.
data "aws_iam_policy_document" "dlq" {
  statement {
    sid       = "EventBridgeRulesOfThisModule"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.dlq.arn]

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

  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.dlq.arn]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "dlq" {
  queue_url = aws_sqs_queue.dlq.id
  policy    = data.aws_iam_policy_document.dlq.json
}
