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
  description = "The controller API's URL on its static internal address: the internal load balancer's with team_store, else the controller VM's (reachable from the VPC, from api_allowed_cidrs, or through an IAP tunnel)."
  value       = local.controller_url
}

output "controller_instance_name" {
  description = "Name of the (first) controller VM (in the first zone of zones)."
  value       = google_compute_instance.controller[0].name
}

output "controller_instances" {
  description = "Every controller VM, name to zone (one leads; `coadapt status` says which)."
  value       = { for vm in google_compute_instance.controller : vm.name => vm.zone }
}

output "store_endpoint" {
  description = "The team store's address, private IP:port of the Cloud SQL instance (null without team_store). No credential: the password is in the secret store_password_secret, readable by the controllers' service account."
  value       = local.team_store ? "${local.store.host}:${local.store.port}" : null
}

output "store_password_secret" {
  description = "Secret Manager secret id holding the team store user's password (null without team_store); the controllers' service account alone is granted to read it."
  value       = local.team_store ? local.store.secret_id : null
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
