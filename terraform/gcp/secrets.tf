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

# With team_store: the team store's database password (team_store.tf). Terraform generates it
# and writes it here (the one version); the controllers' service account may read this secret
# alone (iam.tf) and each controller reads it at start.
resource "google_secret_manager_secret" "store_password" {
  count = local.team_store ? 1 : 0

  project   = var.project
  secret_id = "${local.prefix}-store-password"
  labels    = local.common_labels

  replication {
    auto {}
  }
}

resource "google_secret_manager_secret_version" "store_password" {
  count = local.team_store ? 1 : 0

  secret      = google_secret_manager_secret.store_password[0].id
  secret_data = random_password.store[0].result
}
