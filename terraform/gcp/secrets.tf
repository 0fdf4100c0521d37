# The users' token's secret. Terraform creates the secret only, never a version: `coadapt up`
# makes the token on the controller and adds it as a version, so no token is ever in terraform
# state or plan output. There is no shared agents' secret: the controller writes each node's
# own agent credential into that node's startup script (autoscaler/controller/cloud_setup.py).
#
# The users' token: what `coadapt destroy` and a user's CLI read (with the deployer's own
# credentials, e.g. `gcloud secrets versions access latest --secret ...`).
resource "google_secret_manager_secret" "user_token" {
  project   = var.project
  secret_id = local.user_token_secret_id
  labels    = local.common_labels

  replication {
    auto {}
  }
}
