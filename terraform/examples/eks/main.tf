# queue-processor for an EKS cluster with two self-managed node groups (an on-demand and a Spot Auto Scaling
# group), alarms sent to an SNS topic.
#
#   terraform init
#   terraform apply -var cluster_name=prod -var on_demand_asg_name=prod-on-demand -var spot_asg_name=prod-spot \
#     -var alarm_email=oncall@example.com
#
# Then install the chart with the outputs, as release queue-processor in kube-system (the service account the
# role trusts, below): queueURL = queue_url, serviceAccount.annotations = service_account_annotations.

terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}

provider "aws" {
  region = var.region
}

variable "region" {
  description = "AWS region of the cluster."
  type        = string
  default     = "eu-west-1"
}

variable "cluster_name" {
  description = "Name of the existing EKS cluster."
  type        = string
}

variable "on_demand_asg_name" {
  description = "Name of the on-demand node group's Auto Scaling group."
  type        = string
}

variable "spot_asg_name" {
  description = "Name of the Spot node group's Auto Scaling group."
  type        = string
}

variable "alarm_email" {
  description = "E-mail address subscribed to the alarm topic; null for none (subscribe your pager to the topic instead)."
  type        = string
  default     = null
}

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

# The cluster's IAM OIDC provider, which EKS clusters using IRSA already have.
data "aws_iam_openid_connect_provider" "this" {
  url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer
}

# --- where alarms go ---------------------------------------------------------------------------------------------

# CloudWatch cannot publish to a topic encrypted with the AWS managed key alias/aws/sns (its key policy does not
# admit cloudwatch.amazonaws.com), so the topic gets a small key of its own that does.
data "aws_iam_policy_document" "alarms_key" {
  # The first statement is AWS's default key policy: the account administers its key. In a key policy the
  # resource "*" means the key itself, not every resource.
  #checkov:skip=CKV_AWS_109:Key policy: "*" is this key, and account-root administration is AWS's default key policy.
  #checkov:skip=CKV_AWS_111:Key policy: "*" is this key, and account-root administration is AWS's default key policy.
  #checkov:skip=CKV_AWS_356:Key policy: "*" as resource means the key the policy is attached to, nothing else.
  statement {
    sid       = "AccountAdministersTheKey"
    effect    = "Allow"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }

  statement {
    sid       = "CloudWatchPublishesAlarms"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["cloudwatch.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

resource "aws_kms_key" "alarms" {
  description         = "Encrypts the queue-processor alarm topic of cluster ${var.cluster_name}"
  enable_key_rotation = true
  policy              = data.aws_iam_policy_document.alarms_key.json
}

resource "aws_sns_topic" "alarms" {
  name              = "${var.cluster_name}-queue-processor-alarms"
  kms_master_key_id = aws_kms_key.alarms.arn
}

resource "aws_sns_topic_subscription" "alarm_email" {
  count = var.alarm_email == null ? 0 : 1

  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = var.alarm_email
}

# --- the module --------------------------------------------------------------------------------------------------

module "queue_processor" {
  source = "../.."

  cluster_name      = var.cluster_name
  asg_names         = [var.on_demand_asg_name, var.spot_asg_name]
  oidc_provider_arn = data.aws_iam_openid_connect_provider.this.arn
  oidc_provider_url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer

  # Where the chart installs the controller.
  service_account_namespace = "kube-system"
  service_account_name      = "queue-processor"

  # A terminating node gets up to ten minutes between heartbeats before its hook gives up; the controller
  # heartbeats every five while it drains.
  hook_heartbeat_timeout_seconds = 600

  alarm_actions = [aws_sns_topic.alarms.arn]
  ok_actions    = [aws_sns_topic.alarms.arn]
  runbook_url   = "https://github.com/example-org/queue-processor/blob/main/docs/runbook.md"

  tags = {
    "team" = "platform"
  }
}

output "queue_url" {
  description = "The controller's QUEUE_URL."
  value       = module.queue_processor.queue_url
}

output "service_account_annotations" {
  description = "Annotations for the controller's service account."
  value       = module.queue_processor.service_account_annotations
}

output "dlq_url" {
  description = "Dead-letter queue, for the runbook."
  value       = module.queue_processor.dlq_url
}

output "alarm_topic_arn" {
  description = "Topic the alarms publish to; subscribe your pager to it."
  value       = aws_sns_topic.alarms.arn
}
