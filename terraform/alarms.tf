# Three CloudWatch alarms, each naming what it means and linking the runbook section that says what to do.
#
# treat_missing_data:
# - queue alarms: notBreaching. The controller long-polls without pause, which keeps the queue active and its
#   metrics published; SQS stops publishing only for a queue nobody reads and nothing reaches for six hours,
#   and then nothing is waiting. As soon as a message arrives the metrics come back and the alarm can fire.
# - dead-letter queue: ignore. Nobody polls the DLQ, so SQS may stop publishing its metrics while messages
#   still sit in it; notBreaching would then turn the alarm OK on a queue that is not empty. ignore keeps the
#   last state until the queue is emptied (redrive or purge), which publishes a zero again.

resource "aws_cloudwatch_metric_alarm" "oldest_message_age" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-oldest-message-age"
  alarm_description   = "Interruption messages of cluster ${var.cluster_name} have waited over ${var.oldest_message_age_alarm_threshold_seconds} s in ${aws_sqs_queue.this.name}: nodes are going away without being drained. The controller is down, cannot reach AWS or the API server, or a drain keeps failing (PodDisruptionBudget, stuck pod). Check the controller's pods and logs, then follow ${var.runbook_url}#oldest-message-age"
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateAgeOfOldestMessage"
  dimensions          = { QueueName = aws_sqs_queue.this.name }
  statistic           = "Maximum"
  period              = var.alarm_period_seconds
  evaluation_periods  = var.alarm_evaluation_periods
  threshold           = var.oldest_message_age_alarm_threshold_seconds
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = var.alarm_actions
  ok_actions          = var.ok_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "messages_visible" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-messages-visible"
  alarm_description   = "More than ${var.messages_visible_alarm_threshold} interruption messages of cluster ${var.cluster_name} are waiting in ${aws_sqs_queue.this.name} and nobody receives them. Check that the controller runs, that its role can be assumed (IRSA) and that QUEUE_URL names this queue, then follow ${var.runbook_url}#messages-visible"
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.this.name }
  statistic           = "Maximum"
  period              = var.alarm_period_seconds
  evaluation_periods  = var.alarm_evaluation_periods
  threshold           = var.messages_visible_alarm_threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = var.alarm_actions
  ok_actions          = var.ok_actions
  tags                = local.tags
}

resource "aws_cloudwatch_metric_alarm" "dlq_not_empty" {
  count = var.create_alarms ? 1 : 0

  alarm_name          = "${local.name}-dead-letter-queue-not-empty"
  alarm_description   = "Messages reached ${aws_sqs_queue.dlq.name}, the dead-letter queue of cluster ${var.cluster_name}: messages the controller could not parse or kept failing on, or events EventBridge could not deliver (see the ERROR_CODE attribute). Inspect them with queue-processor inspect, fix the cause, then redrive or purge: ${var.runbook_url}#dead-letter-queue-not-empty"
  namespace           = "AWS/SQS"
  metric_name         = "ApproximateNumberOfMessagesVisible"
  dimensions          = { QueueName = aws_sqs_queue.dlq.name }
  statistic           = "Maximum"
  period              = var.alarm_period_seconds
  evaluation_periods  = 1
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "ignore"
  alarm_actions       = var.alarm_actions
  ok_actions          = var.ok_actions
  tags                = local.tags
}
