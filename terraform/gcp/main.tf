# Names and derived values shared by the resource files (network.tf, iam.tf, secrets.tf,
# storage.tf, controller.tf). No provider block here: the caller configures "google".

locals {
  prefix = "coadapt-${var.cluster_id}"

  # Network tags: what the firewall rules select instances by. The controller puts the node
  # tag on every GPU node it creates (provider.json "network_tags").
  node_tag       = "${local.prefix}-node"
  controller_tag = "${local.prefix}-controller"

  create_network = var.network == null

  # Self links (or project-relative paths, which GCE accepts the same) of the network and
  # subnetwork the controller and the nodes use.
  network_self_link = local.create_network ? google_compute_network.coadapt[0].self_link : (
    can(regex("^(https://|projects/)", var.network)) ? var.network : "projects/${var.project}/global/networks/${var.network}"
  )
  subnetwork_self_link = local.create_network ? google_compute_subnetwork.coadapt[0].self_link : (
    var.subnetwork == null ? null : (
      can(regex("^(https://|projects/)", var.subnetwork)) ? var.subnetwork : "projects/${var.project}/regions/${var.region}/subnetworks/${var.subnetwork}"
    )
  )

  # Service account ids are 6-30 characters: long cluster ids get a short digest instead.
  sa_stem          = length("${local.prefix}-ctl") <= 30 ? local.prefix : "coadapt-${substr(sha256(var.cluster_id), 0, 12)}"
  controller_sa_id = "${local.sa_stem}-ctl"
  node_sa_id       = "${local.sa_stem}-node"

  # Custom role ids allow [a-zA-Z0-9_.] only.
  controller_role_id = "coadapt_${replace(var.cluster_id, "-", "_")}_controller"

  # Bucket names are at most 63 characters: fall back to a digest of the project id.
  bucket_long_name = "${local.prefix}-checkpoints-${var.project}"
  bucket_name      = length(local.bucket_long_name) <= 63 ? local.bucket_long_name : "${local.prefix}-ckpt-${substr(sha256(var.project), 0, 8)}"

  user_token_secret_id = "${local.prefix}-user-token"

  controller_name = "${local.prefix}-controller"
  controller_url  = "http://${google_compute_address.controller.address}:${var.controller_port}"

  common_labels = merge(var.labels, {
    coadapt-cluster-id = var.cluster_id
    coadapt-managed-by = "terraform"
  })

  # What the controller reads from /etc/coadapt/provider.json (autoscaler/controller/cloud_setup.py)
  # and what the provider_config output returns.
  provider_config = {
    kind                  = "gcp"
    project               = var.project
    zones                 = var.zones
    image                 = var.node_image
    network               = local.network_self_link
    subnetwork            = local.subnetwork_self_link
    service_account_email = google_service_account.node.email
    external_ip           = false
    network_tags          = [local.node_tag]
    checkpoint_root       = "gs://${google_storage_bucket.checkpoints.name}/checkpoints"
    user_token_secret     = google_secret_manager_secret.user_token.secret_id
    controller_url        = local.controller_url
    coadapt_pip_spec      = var.coadapt_pip_spec
  }
}
