# Lifecycle hooks on the cluster's Auto Scaling groups.
#
# Terminate: an instance leaving a group waits in Terminating:Wait while the controller drains its node, then
# the controller completes the action with CONTINUE. default_result is CONTINUE: if nobody completes the action
# within the heartbeat timeout (controller down), the instance terminates as it would have without the hook.
# For a terminating instance ABANDON would terminate it all the same, but also skip any other terminate hook
# of the group, which is worse and gains nothing.
#
# Launch (optional): a new instance waits in Pending:Wait until the controller sees its node registered and
# Ready, then completes the action with CONTINUE. A node not Ready LAUNCH_READY_TIMEOUT_SEC after the launch
# began gets the hook's default_result from the controller at once (and from Auto Scaling at the heartbeat
# timeout when no controller runs). default_result defaults to ABANDON, AWS's own default: a node that did not
# turn Ready in time is replaced rather than put in service broken. The price is that while the controller is
# down every launch is abandoned after the timeout and the group cannot grow; choose CONTINUE
# (launch_hook_default_result) when scale-out matters more than keeping an unready node out: the controller
# follows the hook's choice.

locals {
  hooked_groups = var.create_lifecycle_hooks ? toset(var.asg_names) : toset([])
}

resource "aws_autoscaling_lifecycle_hook" "terminate" {
  for_each = local.hooked_groups

  name                    = var.terminate_hook_name
  autoscaling_group_name  = each.value
  lifecycle_transition    = "autoscaling:EC2_INSTANCE_TERMINATING"
  heartbeat_timeout       = var.hook_heartbeat_timeout_seconds
  default_result          = "CONTINUE"
  notification_target_arn = var.enable_direct_lifecycle_notifications ? aws_sqs_queue.this.arn : null
  role_arn                = var.enable_direct_lifecycle_notifications ? aws_iam_role.asg_notifications[0].arn : null

  # The way to the queue exists before the first action can be sent along it.
  depends_on = [
    aws_cloudwatch_event_target.this,
    aws_sqs_queue_policy.this,
    aws_iam_role_policy.asg_notifications,
  ]
}

resource "aws_autoscaling_lifecycle_hook" "launch" {
  for_each = var.enable_launch_lifecycle_hook ? local.hooked_groups : toset([])

  name                    = var.launch_hook_name
  autoscaling_group_name  = each.value
  lifecycle_transition    = "autoscaling:EC2_INSTANCE_LAUNCHING"
  heartbeat_timeout       = var.launch_hook_heartbeat_timeout_seconds
  default_result          = var.launch_hook_default_result
  notification_target_arn = var.enable_direct_lifecycle_notifications ? aws_sqs_queue.this.arn : null
  role_arn                = var.enable_direct_lifecycle_notifications ? aws_iam_role.asg_notifications[0].arn : null

  depends_on = [
    aws_cloudwatch_event_target.this,
    aws_sqs_queue_policy.this,
    aws_iam_role_policy.asg_notifications,
  ]
}
