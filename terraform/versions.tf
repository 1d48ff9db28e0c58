terraform {
  # 1.5: variable validations, lifecycle preconditions and optional() object attributes are all stable there.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0"
    }
  }
}
