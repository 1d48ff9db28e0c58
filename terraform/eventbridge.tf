# One EventBridge rule per message kind the controller acts on, keyed by the kind's name in the controller
# (queue_processor.events.EventKind), each with the queue as its target.
#
# The patterns are narrowed to what the controller acts on, so the queue does not carry what would only be
# skipped: lifecycle actions of the cluster's groups and of this module's hooks (never another team's hook on
# the same group: the controller completes whatever action it is given), the four EC2 states that take an
# instance away, and AWS Health scheduled changes for EC2.

locals {
  all_event_rules = {
    "asg-terminate-lifecycle" = {
      description = "Terminate lifecycle actions of hook ${var.terminate_hook_name} on the cluster's Auto Scaling groups"
      pattern = {
        source        = ["aws.autoscaling"]
        "detail-type" = ["EC2 Instance-terminate Lifecycle Action"]
        detail = {
          AutoScalingGroupName = var.asg_names
          LifecycleHookName    = [var.terminate_hook_name]
        }
      }
    }
    "asg-launch-lifecycle" = {
      description = "Launch lifecycle actions of hook ${var.launch_hook_name} on the cluster's Auto Scaling groups"
      pattern = {
        source        = ["aws.autoscaling"]
        "detail-type" = ["EC2 Instance-launch Lifecycle Action"]
        detail = {
          AutoScalingGroupName = var.asg_names
          LifecycleHookName    = [var.launch_hook_name]
        }
      }
    }
    "spot-interruption" = {
      description = "EC2 Spot Instance interruption warnings (two minutes' notice)"
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Spot Instance Interruption Warning"]
      }
    }
    "rebalance-recommendation" = {
      description = "EC2 instance rebalance recommendations (a Spot instance at elevated risk of interruption)"
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Instance Rebalance Recommendation"]
      }
    }
    "state-change" = {
      description = "EC2 instances stopping, stopped, shutting down or terminated"
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Instance State-change Notification"]
        detail = {
          state = ["stopping", "stopped", "shutting-down", "terminated"]
        }
      }
    }
    "scheduled-change" = {
      description = "AWS Health scheduled changes (maintenance, retirement) for EC2"
      pattern = {
        source        = ["aws.health"]
        "detail-type" = ["AWS Health Event"]
        detail = {
          service           = ["EC2"]
          eventTypeCategory = ["scheduledChange"]
        }
      }
    }
    "capacity-reservation-interruption" = {
      description = "Interruption warnings for instances in interruptible Capacity Reservations"
      pattern = {
        source        = ["aws.ec2"]
        "detail-type" = ["EC2 Capacity Reservation Instance Interruption Warning"]
      }
    }
  }

  # Without a launch hook there are no launch actions of ours to catch.
  event_rules = {
    for kind, rule in local.all_event_rules : kind => rule
    if kind != "asg-launch-lifecycle" || var.enable_launch_lifecycle_hook
  }
}

resource "aws_cloudwatch_event_rule" "this" {
  for_each = local.event_rules

  name          = "${local.name}-${each.key}"
  description   = each.value.description
  event_pattern = jsonencode(each.value.pattern)
  tags          = local.tags
}

resource "aws_cloudwatch_event_target" "this" {
  for_each = aws_cloudwatch_event_rule.this

  rule      = each.value.name
  target_id = "queue-processor"
  arn       = aws_sqs_queue.this.arn

  # What EventBridge gives up on (after its 24 hours of retries, or at once for a permission error) lands in
  # the dead-letter queue, where the DLQ alarm sees it, instead of vanishing.
  dead_letter_config {
    arn = aws_sqs_queue.dlq.arn
  }
}
