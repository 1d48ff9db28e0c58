# queue-processor: what AWS needs so that the controller hears about every interruption of a cluster node.
#
#   EventBridge rules (one per message kind) --> SQS queue --> controller (IRSA role)
#   Auto Scaling lifecycle hooks --(as events, or straight to the queue)--^
#   poison and undeliverable messages --> dead-letter queue (redrive policy, rule targets' DLQ config)
#   CloudWatch alarms on both queues
#
# Files: sqs.tf (queues and their policies), eventbridge.tf (rules and targets), hooks.tf (lifecycle hooks),
# iam.tf (controller role, Auto Scaling notification role, KMS statements), alarms.tf, outputs.tf.

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

locals {
  name        = coalesce(var.name_prefix, "${var.cluster_name}-qp")
  kms_enabled = var.kms_key_arn != null
  oidc_issuer = trimprefix(var.oidc_provider_url, "https://")

  partition  = data.aws_partition.current.partition
  dns_suffix = data.aws_partition.current.dns_suffix
  account_id = data.aws_caller_identity.current.account_id
  # The region is read from the queue's ARN (arn:<partition>:sqs:<region>:<account>:<name>) rather than from
  # the aws_region data source, whose attribute names differ between provider 5.x and 6.x.
  region = split(":", aws_sqs_queue.this.arn)[3]

  # An Auto Scaling group's ARN carries an ID AWS assigns (autoScalingGroup:<uuid>:autoScalingGroupName/<name>);
  # the name is what this module knows, so the ID is a wildcard. Names are unique per account and region.
  asg_arns = [
    for name in var.asg_names :
    "arn:${local.partition}:autoscaling:${local.region}:${local.account_id}:autoScalingGroup:*:autoScalingGroupName/${name}"
  ]

  rule_arns = [for rule in aws_cloudwatch_event_rule.this : rule.arn]

  tags = merge({ "queue-processor/cluster" = var.cluster_name }, var.tags)
}
