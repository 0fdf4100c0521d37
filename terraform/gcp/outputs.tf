# The outputs `coadapt deploy gcp` records in <state>/deploy.json (autoscaler/controller/deploy.py,
# OUTPUTS["gcp"]) and the CLI reads.

output "cluster_id" {
  description = "The cluster's id (labels every node the controller creates)."
  value       = var.cluster_id
}

output "project" {
  description = "The GCP project the cluster lives in."
  value       = var.project
}

output "region" {
  description = "The GCP region of the subnetwork, the controller address and the checkpoint bucket."
  value       = var.region
}

output "controller_url" {
  description = "The controller API's URL on its static internal address (reachable from the VPC, from api_allowed_cidrs, or through an IAP tunnel)."
  value       = local.controller_url
}

output "controller_instance_name" {
  description = "Name of the controller VM (in the first zone of zones)."
  value       = google_compute_instance.controller.name
}

output "checkpoint_bucket" {
  description = "Name of the GCS bucket the nodes write checkpoints to (under checkpoints/)."
  value       = google_storage_bucket.checkpoints.name
}

output "user_token_secret" {
  description = "Secret Manager secret id holding the users' API token (versions are added by the controller; the deployer reads it with their own credentials)."
  value       = google_secret_manager_secret.user_token.secret_id
}

output "node_service_account_email" {
  description = "Email of the service account the GPU nodes run as."
  value       = google_service_account.node.email
}

output "controller_service_account_email" {
  description = "Email of the service account the controller VM runs as."
  value       = google_service_account.controller.email
}

output "provider_config" {
  description = "The object the controller reads as /etc/coadapt/provider.json (kind gcp: project, zones, node image, network, subnetwork, node service account, network tags, checkpoint root, token secrets, controller URL, pip spec)."
  value       = local.provider_config
}
