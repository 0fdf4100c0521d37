# The checkpoint bucket: private (uniform access, public access prevention), versioned, with
# overwritten or deleted checkpoint versions kept `checkpoint_retention_days`.

resource "google_storage_bucket" "checkpoints" {
  #checkov:skip=CKV_GCP_62:Access logging to another bucket is left to the deployer; Cloud Audit Logs (Data Access) cover object access when an organisation wants them.
  project                     = var.project
  name                        = local.bucket_name
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false
  labels                      = local.common_labels

  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.checkpoint_retention_days
    }
    action {
      type = "Delete"
    }
  }
}
