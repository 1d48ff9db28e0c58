# queue-processor with both queues encrypted by a customer managed KMS key, a launch hook, and hook
# notifications also sent straight to the queue (not only through EventBridge).
#
# The key's policy is where EventBridge gets its right to use the key: the module outputs the statements
# (kms_key_policy_json), and they are merged into the key policy here. The controller and the Auto Scaling
# notification role get theirs from their IAM policies, which the key policy allows by delegating to IAM.

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

variable "asg_names" {
  description = "Auto Scaling groups of the cluster's self-managed nodes."
  type        = list(string)
}

variable "alarm_topic_arn" {
  description = "Existing SNS topic for the alarms."
  type        = string
}

data "aws_partition" "current" {}

data "aws_caller_identity" "current" {}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

data "aws_iam_openid_connect_provider" "this" {
  url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer
}

# Created with AWS's default key policy (the account administers the key); aws_kms_key_policy below replaces it
# once the module's rules exist, adding their statements.
resource "aws_kms_key" "queues" {
  description             = "Encrypts the queue-processor queues of cluster ${var.cluster_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30
}

data "aws_iam_policy_document" "queues_key" {
  source_policy_documents = [module.queue_processor.kms_key_policy_json]

  # AWS's default key policy: the account administers the key, and IAM policies may grant its use. In a key
  # policy "*" as resource is the key itself.
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
}

resource "aws_kms_key_policy" "queues" {
  key_id = aws_kms_key.queues.id
  policy = data.aws_iam_policy_document.queues_key.json
}

module "queue_processor" {
  source = "../.."

  cluster_name      = var.cluster_name
  asg_names         = var.asg_names
  oidc_provider_arn = data.aws_iam_openid_connect_provider.this.arn
  oidc_provider_url = data.aws_eks_cluster.this.identity[0].oidc[0].issuer

  kms_key_arn = aws_kms_key.queues.arn

  # New nodes stay in Pending:Wait until the controller sees them Ready; one that is not Ready within 15
  # minutes is replaced.
  enable_launch_lifecycle_hook          = true
  launch_hook_heartbeat_timeout_seconds = 900
  launch_hook_default_result            = "ABANDON"

  # Each lifecycle action arrives twice (EventBridge and the hook's own notification); the controller
  # handles it once. Either path alone would do; both keep working while the other is misconfigured.
  enable_direct_lifecycle_notifications = true

  alarm_actions = [var.alarm_topic_arn]
}

output "queue_url" {
  description = "The controller's QUEUE_URL."
  value       = module.queue_processor.queue_url
}

output "service_account_annotations" {
  description = "Annotations for the controller's service account."
  value       = module.queue_processor.service_account_annotations
}
