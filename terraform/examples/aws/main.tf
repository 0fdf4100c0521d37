# Deploy coadapt on AWS by hand (what `coadapt deploy aws` generates for you):
#   cp terraform.tfvars.example terraform.tfvars   # and edit it
#   terraform init && terraform apply

terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.0, < 6.0"
    }
  }
}

variable "region" {
  type        = string
  description = "The AWS region."
}

variable "cluster_id" {
  type        = string
  description = "The cluster's id (see ../../aws/README.md)."
}

variable "node_ami_id" {
  type        = string
  description = "The GPU nodes' AMI (NVIDIA drivers, python3.11+, the AWS CLI)."
}

variable "api_allowed_cidrs" {
  type        = list(string)
  default     = []
  description = "Networks allowed to reach the controller API besides the nodes."
}

variable "vpc_id" {
  type        = string
  default     = null
  description = "An existing VPC (with subnet_ids); null: the module creates one."
}

variable "subnet_ids" {
  type        = list(string)
  default     = []
  description = "Subnets of vpc_id, one per zone (the first holds the controller)."
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  default     = []
  description = "Networks allowed SSH to the controller and the nodes (none by default)."
}

variable "max_instances" {
  type        = number
  default     = 8
  description = "Most GPU nodes the controller holds at once."
}

variable "kms_key_arn" {
  type        = string
  default     = null
  description = "A customer-managed KMS key for the bucket and the volumes (see ../../aws/README.md); null: AWS-managed keys."
}

variable "tags" {
  type        = map(string)
  default     = {}
  description = "Extra tags on every resource the module creates."
}

provider "aws" {
  region = var.region
}

module "coadapt" {
  source            = "../../aws"
  cluster_id        = var.cluster_id
  region            = var.region
  node_ami_id       = var.node_ami_id
  api_allowed_cidrs = var.api_allowed_cidrs
  vpc_id            = var.vpc_id
  subnet_ids        = var.subnet_ids
  ssh_allowed_cidrs = var.ssh_allowed_cidrs
  max_instances     = var.max_instances
  kms_key_arn       = var.kms_key_arn
  tags              = var.tags
}

output "cluster_id" {
  description = "The cluster's id."
  value       = module.coadapt.cluster_id
}

output "region" {
  description = "The region."
  value       = module.coadapt.region
}

output "controller_url" {
  description = "The controller API's (private) URL."
  value       = module.coadapt.controller_url
}

output "controller_instance_id" {
  description = "The controller instance."
  value       = module.coadapt.controller_instance_id
}

output "checkpoint_bucket" {
  description = "The checkpoint bucket."
  value       = module.coadapt.checkpoint_bucket
}

output "interruption_queue_url" {
  description = "The interruption events' queue."
  value       = module.coadapt.interruption_queue_url
}

output "launch_template_id" {
  description = "The GPU nodes' launch template."
  value       = module.coadapt.launch_template_id
}

output "agent_credential_path" {
  description = "The SSM path of the nodes' own agent credentials."
  value       = module.coadapt.agent_credential_path
}

output "user_token_parameter" {
  description = "The users' token parameter."
  value       = module.coadapt.user_token_parameter
}

output "node_security_group_id" {
  description = "The nodes' security group."
  value       = module.coadapt.node_security_group_id
}

output "provider_config" {
  description = "The controller's provider config."
  value       = module.coadapt.provider_config
}
