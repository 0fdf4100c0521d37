# The controller VM(s): controller_count (one without team_store) run `coadapt up --provider
# gcp` as a systemd service. The controller creates the GPU nodes itself (instances.insert /
# bulkInsert from provider.json), so there is no instance template for nodes (see README.md).
# With team_store each reads the store's URL at start (team_store.tf) and one leads.

resource "google_compute_address" "controller" {
  project      = var.project
  name         = "${local.prefix}-controller-ip"
  description  = "coadapt ${var.cluster_id}: the controller's internal address (the agents' controller_url)"
  region       = var.region
  subnetwork   = local.subnetwork_self_link
  address_type = "INTERNAL"

  lifecycle {
    precondition {
      condition     = (var.network == null) == (var.subnetwork == null)
      error_message = "Give both network and subnetwork (an existing network), or neither (the module creates them)."
    }
    precondition {
      condition     = alltrue([for z in var.zones : startswith(z, "${var.region}-")])
      error_message = "Every zone in zones must belong to region ${var.region}."
    }
  }
}

locals {
  # POSIX single-quoted for the shell.
  pip_spec_shell = "'${replace(var.coadapt_pip_spec, "'", "'\\''")}'"

  controller_command = join(" ", [
    "/opt/coadapt/bin/coadapt", "up",
    "--provider", "gcp",
    "--provider-config", "/etc/coadapt/provider.json",
    "--cluster-id", var.cluster_id,
    "--state-dir", "/var/lib/coadapt",
    "--host", "0.0.0.0",
    "--port", tostring(var.controller_port),
    "--max-instances", tostring(var.max_instances),
  ])

  controller_startup_script = templatefile("${path.module}/templates/controller-startup.sh.tftpl", {
    pip_spec_shell     = local.pip_spec_shell
    provider_json      = jsonencode(local.provider_config)
    controller_command = local.controller_command
    store              = local.store
  })
}

resource "google_compute_instance" "controller" {
  #checkov:skip=CKV_GCP_40:No external IP by default: the access_config block exists only when the deployer sets controller_external_ip = true (a dynamic block checkov cannot evaluate); the API port stays closed to the internet either way (api_allowed_cidrs refuses 0.0.0.0/0).
  #checkov:skip=CKV_GCP_38:The boot disk (the controller's store and API tokens file) is encrypted at rest with Google-managed keys; customer-supplied keys would put raw key material in the terraform configuration and state, a worse place for it.
  count = local.controller_count

  project      = var.project
  name         = count.index == 0 ? local.controller_name : "${local.controller_name}-${count.index}"
  description  = "coadapt cluster ${var.cluster_id}: controller (coadapt up --provider gcp)"
  zone         = local.controller_zones[count.index]
  machine_type = var.controller_machine_type
  tags         = [local.controller_tag]
  labels       = local.common_labels

  can_ip_forward            = false
  allow_stopping_for_update = true

  boot_disk {
    auto_delete = true
    initialize_params {
      image  = var.controller_image
      size   = 20
      type   = "pd-balanced"
      labels = local.common_labels
    }
  }

  network_interface {
    network    = local.network_self_link
    subnetwork = local.subnetwork_self_link
    # With team_store the static address is the balancer's (team_store.tf).
    network_ip = local.team_store ? null : google_compute_address.controller.address

    dynamic "access_config" {
      for_each = var.controller_external_ip ? [1] : []
      content {
        network_tier = "PREMIUM"
      }
    }
  }

  service_account {
    email  = google_service_account.controller.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = true
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  # Changing the startup script (e.g. another provider.json) updates the metadata in place:
  # it takes effect at the controller's next boot, not by replacing the VM (which would lose
  # the controller's state and strand its nodes).
  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    serial-port-enable     = "FALSE"
    startup-script         = local.controller_startup_script
  }

  depends_on = [
    # The service must find its permissions and the secrets when it starts.
    google_project_iam_member.controller_compute,
    google_project_iam_member.controller_logs,
    google_service_account_iam_member.controller_acts_as_node,
    google_secret_manager_secret_iam_member.controller_adds_user_token,
    # And outbound access for pip.
    google_compute_router_nat.coadapt,
    # With team_store: the store, its user and the password the service reads at start.
    google_sql_database.store,
    google_sql_user.store,
    google_secret_manager_secret_version.store_password,
    google_secret_manager_secret_iam_member.controller_reads_store_password,
  ]

  lifecycle {
    precondition {
      condition     = local.controller_count == 1 || var.team_store
      error_message = "controller_count above 1 needs team_store = true (controllers share only a PostgreSQL store)."
    }
  }
}
