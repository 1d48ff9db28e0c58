output "queue_url" {
  description = "URL of the queue: the controller's QUEUE_URL (Helm value)."
  value       = aws_sqs_queue.this.url
}

output "queue_arn" {
  description = "ARN of the queue."
  value       = aws_sqs_queue.this.arn
}

output "queue_name" {
  description = "Name of the queue."
  value       = aws_sqs_queue.this.name
}

output "dlq_url" {
  description = "URL of the dead-letter queue, for inspecting and redriving what landed there."
  value       = aws_sqs_queue.dlq.url
}

output "dlq_arn" {
  description = "ARN of the dead-letter queue."
  value       = aws_sqs_queue.dlq.arn
}

output "role_arn" {
  description = "ARN of the controller's IAM role: annotate the controller's service account with it (eks.amazonaws.com/role-arn)."
  value       = aws_iam_role.controller.arn
}

output "role_name" {
  description = "Name of the controller's IAM role."
  value       = aws_iam_role.controller.name
}

output "service_account_annotations" {
  description = "Annotations for the controller's Kubernetes service account (the chart's serviceAccount.annotations)."
  value       = { "eks.amazonaws.com/role-arn" = aws_iam_role.controller.arn }
}

output "rule_arns" {
  description = "ARNs of the EventBridge rules, by message kind (asg-terminate-lifecycle, spot-interruption, ...)."
  value       = { for kind, rule in aws_cloudwatch_event_rule.this : kind => rule.arn }
}

output "lifecycle_hook_names" {
  description = "Names of the lifecycle hooks the rules match: terminate, and launch (null without the launch hook)."
  value = {
    terminate = var.terminate_hook_name
    launch    = var.enable_launch_lifecycle_hook ? var.launch_hook_name : null
  }
}

output "asg_notification_role_arn" {
  description = "ARN of the role Auto Scaling assumes to send hook notifications straight to the queue; null unless enable_direct_lifecycle_notifications."
  value       = var.enable_direct_lifecycle_notifications ? aws_iam_role.asg_notifications[0].arn : null
}

output "alarm_arns" {
  description = "ARNs of the CloudWatch alarms (empty without create_alarms)."
  value = var.create_alarms ? {
    oldest_message_age          = aws_cloudwatch_metric_alarm.oldest_message_age[0].arn
    messages_visible            = aws_cloudwatch_metric_alarm.messages_visible[0].arn
    dead_letter_queue_not_empty = aws_cloudwatch_metric_alarm.dlq_not_empty[0].arn
  } : {}
}

output "kms_key_policy_json" {
  description = "With kms_key_arn: the key policy statements that let this module's EventBridge rules use the key, as a policy document to merge into the key's policy (e.g. source_policy_documents of an aws_iam_policy_document). Null with SSE-SQS."
  value       = local.kms_enabled ? data.aws_iam_policy_document.kms_for_eventbridge.json : null
}
