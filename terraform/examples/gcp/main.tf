# Example root module: one coadapt cluster on GCP. Copy terraform.tfvars.example to
# terraform.tfvars, fill it in, then `terraform init && terraform apply`.
# (`coadapt deploy gcp` writes an equivalent root module itself; see terraform/gcp/README.md.)

terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0, < 7.0"
    }
  }
}

variable "project" {
  type        = string
  description = "GCP project id."
}

variable "region" {
  type        = string
  description = "GCP region, e.g. us-central1."
}

variable "zones" {
  type        = list(string)
  description = "Zones of the region where GPU nodes may be launched."
}

variable "cluster_id" {
  type        = string
  description = "The cluster's id (1-40 characters of [a-z0-9-])."
}

variable "node_image" {
  type        = string
  description = "GPU node image with NVIDIA drivers, python3 and pip."
}

variable "api_allowed_cidrs" {
  type        = list(string)
  description = "Ranges allowed to reach the controller API (never 0.0.0.0/0)."
  default     = []
}

variable "ssh_allowed_cidrs" {
  type        = list(string)
  description = "Ranges allowed to SSH in, e.g. [\"35.235.240.0/20\"] for IAP."
  default     = []
}

variable "max_instances" {
  type        = number
  description = "Fleet size cap."
  default     = 8
}

provider "google" {
  project = var.project
  region  = var.region
}

module "coadapt" {
  source = "../../gcp"

  project           = var.project
  region            = var.region
  zones             = var.zones
  cluster_id        = var.cluster_id
  node_image        = var.node_image
  api_allowed_cidrs = var.api_allowed_cidrs
  ssh_allowed_cidrs = var.ssh_allowed_cidrs
  max_instances     = var.max_instances
}

output "cluster_id" {
  description = "The cluster's id."
  value       = module.coadapt.cluster_id
}

output "project" {
  description = "The GCP project."
  value       = module.coadapt.project
}

output "region" {
  description = "The GCP region."
  value       = module.coadapt.region
}

output "controller_url" {
  description = "The controller API's URL (internal address)."
  value       = module.coadapt.controller_url
}

output "controller_instance_name" {
  description = "Name of the controller VM."
  value       = module.coadapt.controller_instance_name
}

output "checkpoint_bucket" {
  description = "The checkpoint bucket."
  value       = module.coadapt.checkpoint_bucket
}

output "user_token_secret" {
  description = "Secret Manager secret id of the users' token."
  value       = module.coadapt.user_token_secret
}

output "node_service_account_email" {
  description = "Service account of the GPU nodes."
  value       = module.coadapt.node_service_account_email
}

output "controller_service_account_email" {
  description = "Service account of the controller VM."
  value       = module.coadapt.controller_service_account_email
}

output "provider_config" {
  description = "The controller's provider.json, as an object."
  value       = module.coadapt.provider_config
}
