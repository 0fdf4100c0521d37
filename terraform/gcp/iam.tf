# Two service accounts with the least they need:
# * controller: a custom role with exactly the Compute Engine permissions the GCP adapter uses
#   (providers/gcp/permissions.py), actAs on the node account only, adding versions to the
#   users' token secret only, and log writing; with team_store, reading the store's password
#   secret only (no Cloud SQL role: team_store.tf says why);
# * node: object read/write in the checkpoint bucket only, and log writing. No secret: each
#   node's own agent credential comes in its startup script, written by the controller.

locals {
  # The Compute Engine permissions of the controller's custom role: what each REST method the
  # adapter calls needs (providers/gcp/permissions.py, ADAPTER_METHODS), nothing more.
  controller_permissions = [
    "compute.acceleratorTypes.list",       # acceleratorTypes.aggregatedList: which zones have each GPU (check_zone_availability)
    "compute.disks.create",                # instances.insert / bulkInsert: each node's boot disk
    "compute.instances.create",            # instances.insert / bulkInsert: the GPU nodes
    "compute.instances.delete",            # instances.delete: terminate and scale-in
    "compute.instances.get",               # instances.get: an id not in the listing (gone? someone else's?)
    "compute.instances.list",              # instances.aggregatedList: the cluster's nodes by label
    "compute.instances.setLabels",         # insert / bulkInsert with labels (cluster id, request id)
    "compute.instances.setMetadata",       # insert / bulkInsert with the per-node startup-script
    "compute.instances.setServiceAccount", # insert / bulkInsert with the node service account
    "compute.instances.setTags",           # insert / bulkInsert with the node network tag
    "compute.subnetworks.use",             # insert / bulkInsert: a NIC on the subnetwork
    "compute.zoneOperations.get",          # zoneOperations.wait: launch and delete operations
    "compute.zoneOperations.list",         # zoneOperations.list: pending deletes, preemption events
  ]
}

resource "google_service_account" "controller" {
  project      = var.project
  account_id   = local.controller_sa_id
  display_name = "coadapt ${var.cluster_id} controller"
  description  = "coadapt cluster ${var.cluster_id}: the controller VM (creates and deletes the GPU nodes)"
}

resource "google_service_account" "node" {
  project      = var.project
  account_id   = local.node_sa_id
  display_name = "coadapt ${var.cluster_id} GPU nodes"
  description  = "coadapt cluster ${var.cluster_id}: the GPU nodes (checkpoints)"
}

resource "google_project_iam_custom_role" "controller" {
  project     = var.project
  role_id     = local.controller_role_id
  title       = "coadapt ${var.cluster_id} controller"
  description = "What the coadapt GCP adapter calls: create, list, delete GPU nodes and follow their operations."
  stage       = "GA"
  permissions = local.controller_permissions
}

resource "google_project_iam_member" "controller_compute" {
  project = var.project
  role    = google_project_iam_custom_role.controller.name
  member  = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_project_iam_member" "controller_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.controller.email}"
}

# The controller creates nodes that run as the node account: actAs on that account only.
resource "google_service_account_iam_member" "controller_acts_as_node" {
  service_account_id = google_service_account.node.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.controller.email}"
}

# `coadapt up` publishes the users' token it makes at boot (and after a rotation) as a new
# secret version.
resource "google_secret_manager_secret_iam_member" "controller_adds_user_token" {
  project   = var.project
  secret_id = google_secret_manager_secret.user_token.secret_id
  role      = "roles/secretmanager.secretVersionAdder"
  member    = "serviceAccount:${google_service_account.controller.email}"
}

# With team_store: each controller reads the store's password, and no other secret.
resource "google_secret_manager_secret_iam_member" "controller_reads_store_password" {
  count = local.team_store ? 1 : 0

  project   = var.project
  secret_id = google_secret_manager_secret.store_password[0].secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_project_iam_member" "node_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.node.email}"
}

# Nodes write, read, list and delete checkpoints in the cluster's bucket only.
resource "google_storage_bucket_iam_member" "node_checkpoints" {
  bucket = google_storage_bucket.checkpoints.name
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.node.email}"
}
