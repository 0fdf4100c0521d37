# The API tokens' secrets. Terraform creates the secrets only, never a version: `coadapt up`
# makes the tokens on the controller and adds them as versions, so no token is ever in
# terraform state or plan output.

resource "google_secret_manager_secret" "agent_token" {
  project   = var.project
  secret_id = local.agent_token_secret_id
  labels    = local.common_labels

  replication {
    auto {}
  }
}

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
